// bench/RESULTS.md -> bench/chart.svg (`npm run bench:chart`): grouped horizontal bars, per scenario,
// of the time ratio (rsync time / ffsync time) and the wire-bytes ratio (rsync bytes / ffsync bytes),
// on a log scale with 1x marked; > 1 means ffsync-native is faster / sends less. Reads the main
// tables the harnesses write (bench/run.ts before the first section marker, bench/tree.ts and
// bench/refine.ts between their `<!-- …:begin/end -->` markers); hand-written SVG, no dependency.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { REPO } from './common';

export interface Bar {
  section: string;
  label: string;
  time?: number;
  wire?: number;
}

const SECTIONS: { marker?: string; title: string }[] = [
  { title: 'single file, 1 GiB (bench/run.ts)' },
  { marker: 'tree-bench', title: 'directory trees (bench/tree.ts)' },
  { marker: 'refine-bench', title: 'deltas of real files (bench/refine.ts)' },
];

/** "1.43x" -> 1.43; "—" -> undefined. */
function ratioCell(s: string | undefined): number | undefined {
  const m = /^([\d.]+)x/.exec((s ?? '').trim());
  return m ? Number(m[1]) : undefined;
}

/** The byte formats of bench/common.ts fmtBytes: "146 B", "119.3 KiB", "1024.16 MiB", "1.50 GiB". */
function bytesCell(s: string | undefined): number | undefined {
  const m = /^([\d.]+)\s*(B|KiB|MiB|GiB)\b/.exec((s ?? '').trim());
  if (!m) return undefined;
  return Number(m[1]) * { B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3 }[m[2] as 'B']!;
}

function tables(md: string): { head: string[]; rows: string[][] }[] {
  const out: { head: string[]; rows: string[][] }[] = [];
  const cells = (l: string) => l.trim().replace(/^\||\|$/g, '').split(/(?<!\\)\|/).map((c) => c.trim());
  const lines = md.split('\n');
  for (let i = 0; i + 1 < lines.length; i++) {
    if (!lines[i]!.startsWith('|') || !/^\|[-:|\s]+\|$/.test(lines[i + 1]!.trim())) continue;
    const t = { head: cells(lines[i]!), rows: [] as string[][] };
    for (i += 2; i < lines.length && lines[i]!.startsWith('|'); i++) t.rows.push(cells(lines[i]!));
    out.push(t);
  }
  return out;
}

/** The bars of one section: from every table with a time-ratio column (details tables have none). */
function sectionBars(title: string, md: string): Bar[] {
  const bars: Bar[] = [];
  for (const t of tables(md)) {
    const col = (...names: string[]) => t.head.findIndex((h) => names.includes(h));
    const time = col('speedup vs rsync', 'rsync/ffsync', 'rsync/ffsync time');
    if (time < 0 || col('scenario') < 0) continue;
    const wireRatio = col('wire ratio rsync/ffsync');
    const fw = col('ffsync wire', 'ffsync wire (sent+recv)');
    const rw = col('rsync wire', 'rsync sent+recv');
    const variant = col('ffsync variant');
    const seen = new Set<string>();
    for (const r of t.rows) {
      const scenario = r[col('scenario')]!;
      // One bar pair per scenario: the first variant the table lists (e.g. tree --parallel 1).
      if (seen.has(scenario)) continue;
      seen.add(scenario);
      let wire = wireRatio >= 0 ? ratioCell(r[wireRatio]) : undefined;
      if (wire === undefined && fw >= 0 && rw >= 0) {
        const f = bytesCell(r[fw]);
        const g = bytesCell(r[rw]);
        if (f && g) wire = g / f;
      }
      const label = variant >= 0 && t.rows.some((x) => x !== r && x[col('scenario')] === scenario) ? `${scenario} (${r[variant]!.replace(/^ffsync /, '')})` : scenario;
      bars.push({ section: title, label, time: ratioCell(r[time]), wire });
    }
  }
  return bars;
}

export function parseResults(md: string): Bar[] {
  const bars: Bar[] = [];
  const firstMarker = md.search(/<!-- [\w-]+:begin -->/);
  for (const s of SECTIONS) {
    let body: string;
    if (!s.marker) body = firstMarker >= 0 ? md.slice(0, firstMarker) : md;
    else {
      const i = md.indexOf(`<!-- ${s.marker}:begin -->`);
      const j = md.indexOf(`<!-- ${s.marker}:end -->`);
      if (i < 0 || j < i) continue;
      body = md.slice(i, j);
    }
    bars.push(...sectionBars(s.title, body));
  }
  return bars;
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const fmt = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2)) + 'x';

export function renderSvg(bars: Bar[], source: string): string {
  const values = bars.flatMap((b) => [b.time, b.wire]).filter((x): x is number => x !== undefined && x > 0);
  const lo = Math.min(0.1, 10 ** Math.floor(Math.log10(Math.min(...values))));
  const hi = Math.min(1000, Math.max(10, 10 ** Math.ceil(Math.log10(Math.max(...values)))));
  const labelW = 280;
  const plotW = 520;
  const W = labelW + plotW + 70;
  const barH = 12;
  const groupH = 2 * barH + 8;
  const x = (v: number) => labelW + (plotW * (Math.log10(Math.min(Math.max(v, lo), hi)) - Math.log10(lo))) / (Math.log10(hi) - Math.log10(lo));
  const out: string[] = [];
  let y = 64;
  let section = '';
  const body: string[] = [];
  for (const b of bars) {
    if (b.section !== section) {
      section = b.section;
      y += 10;
      body.push(`<text class="h" x="8" y="${y + 4}">${esc(section)}</text>`);
      y += 14;
    }
    body.push(`<text class="l" x="${labelW - 8}" y="${y + barH + 3}" text-anchor="end">${esc(b.label)}</text>`);
    ([['time', b.time], ['wire', b.wire]] as const).forEach(([kind, v], k) => {
      const by = y + k * barH;
      if (v === undefined) {
        body.push(`<text class="v" x="${x(1) + 4}" y="${by + barH - 2}">n/a</text>`);
        return;
      }
      const x0 = Math.min(x(1), x(v));
      const x1 = Math.max(x(1), x(v));
      body.push(`<rect class="${kind}" x="${x0.toFixed(1)}" y="${by}" width="${Math.max(1, x1 - x0).toFixed(1)}" height="${barH - 1}" rx="1.5"/>`);
      const clipped = v > hi ? '+' : '';
      // The value sits beyond the bar's free end: right of a win, left of a loss.
      const at = v >= 1 ? `x="${(x1 + 4).toFixed(1)}"` : `x="${(x0 - 4).toFixed(1)}" text-anchor="end"`;
      body.push(`<text class="v" ${at} y="${by + barH - 2}">${fmt(v)}${clipped}</text>`);
    });
    y += groupH;
  }
  const H = y + 44;
  const ticks: number[] = [];
  for (let e = Math.round(Math.log10(lo)); e <= Math.round(Math.log10(hi)); e++) ticks.push(10 ** e);
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="-apple-system,BlinkMacSystemFont,'Segoe UI',Helvetica,Arial,sans-serif" font-size="11">`);
  out.push('<title>ffsync-native vs rsync: time and wire-bytes ratios per benchmark scenario</title>');
  out.push(
    '<style>text{fill:#57606a}.h{font-weight:600;fill:#1f2328}.grid{stroke:#8c959f;stroke-opacity:.35}.one{stroke:#8c959f;stroke-width:1.5}' +
      '.v{font-size:10px}.time{fill:#0969da}.wire{fill:#d4a72c}' +
      '@media (prefers-color-scheme:dark){text{fill:#9198a1}.h{fill:#e6edf3}.time{fill:#4493f8}.wire{fill:#e3b341}}</style>',
  );
  out.push(`<text class="h" x="8" y="18" font-size="13">ffsync-native vs rsync — ratio rsync / ffsync-native (log scale; right of 1x: ffsync-native faster / fewer bytes)</text>`);
  out.push(`<rect class="time" x="8" y="30" width="12" height="8"/><text x="24" y="38">time (rsync s / ffsync s)</text>`);
  out.push(`<rect class="wire" x="190" y="30" width="12" height="8"/><text x="206" y="38">bytes on the wire (rsync / ffsync)</text>`);
  for (const t of ticks) {
    out.push(`<line class="${t === 1 ? 'one' : 'grid'}" x1="${x(t).toFixed(1)}" y1="52" x2="${x(t).toFixed(1)}" y2="${H - 36}"/>`);
    out.push(`<text x="${x(t).toFixed(1)}" y="${H - 22}" text-anchor="middle">${t < 1 ? t : t.toFixed(0)}x</text>`);
  }
  out.push(...body);
  out.push(`<text x="${W - 8}" y="${H - 2}" text-anchor="end" font-size="9">generated by npm run bench:chart from ${esc(source)}</text>`);
  out.push('</svg>');
  return out.join('\n') + '\n';
}

function main(): void {
  const src = path.join(REPO, 'bench', 'RESULTS.md');
  const dst = path.join(REPO, 'bench', 'chart.svg');
  const bars = parseResults(fs.readFileSync(src, 'utf8'));
  if (bars.length === 0) throw new Error(`no result tables found in ${src}`);
  fs.writeFileSync(dst, renderSvg(bars, 'bench/RESULTS.md'));
  console.log(`${path.relative(process.cwd(), dst)}: ${bars.length} scenarios`);
  for (const b of bars) console.log(`  ${b.section} | ${b.label}: time ${b.time === undefined ? 'n/a' : fmt(b.time)}, wire ${b.wire === undefined ? 'n/a' : fmt(b.wire)}`);
}

if (require.main === module) main();
