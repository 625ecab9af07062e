// Fault-injection soak (issue #8): many seeded runs of every fault kind against single files
// and trees, each followed by the invariant checks and a rerun (see __test__/helpers/faults.ts).
// Writes its figures into docs/reliability.md, in the section between <!-- faults:begin --> and
// <!-- faults:end --> (only the inner <!-- faults:figures:begin/end --> part once the section exists).
//
//   npm run bench:faults                                  # = node --import tsx bench/faults.ts (20 minutes)
//   nice node --import tsx bench/faults.ts --minutes 5 --seed 42
//   node --import tsx bench/faults.ts --runs 44 --no-write  # a fixed number of runs, print only
//
// The exit status is 1 if any invariant was violated (each violation is printed with the run's
// seed, which replays it: FAULT_KINDS order and the seed fix every random choice).

import * as fs from 'node:fs';
import * as path from 'node:path';
import { FAULT_KINDS, type FaultKind, type RunOutcome, type Shape, SHAPES, plan, runFault } from '../__test__/helpers/faults.js';
import { REPO, benchArgs, intOption, orUsage, commandLine, machineInfo, markdown } from './common.js';

const BEGIN_MARK = '<!-- faults:begin -->';
const END_MARK = '<!-- faults:end -->';
const FIG_BEGIN = '<!-- faults:figures:begin -->';
const FIG_END = '<!-- faults:figures:end -->';

const HELP = `Usage: node --import tsx bench/faults.ts [--minutes 20 | --runs N] [--seed N] [--no-write] [--out docs/reliability.md]
What it does: the comment at the top of bench/faults.ts.
`;
const values = benchArgs(
  process.argv.slice(2),
  {
    seed: { type: 'string' },
    minutes: { type: 'string' },
    runs: { type: 'string' },
    'no-write': { type: 'boolean' },
    out: { type: 'string' },
  },
  HELP,
);
const seed = orUsage(HELP, () => intOption('seed', values.seed, Math.floor(Math.random() * 2 ** 31), 0, 0xffffffff));
const maxRuns = values.runs !== undefined ? orUsage(HELP, () => intOption('runs', values.runs, 1, 1, 10_000_000)) : Infinity;
const minutes = orUsage(HELP, () => intOption('minutes', values.minutes, 20, 1, 10_000));
const deadline = Date.now() + (values.runs !== undefined ? Infinity : minutes * 60_000);
const outFile = path.resolve(values.out ?? path.join(REPO, 'docs', 'reliability.md'));

interface Cell {
  runs: number;
  failed: number;
  partials: number;
  skipped: number;
  violations: number;
}

async function main() {
  console.log(`fault soak: seed ${seed}, ${values.runs !== undefined ? `${maxRuns} runs` : `${minutes} minutes`}`);
  const cells = new Map<string, Cell>();
  const cell = (k: FaultKind, s: Shape) => {
    const key = `${k}/${s}`;
    if (!cells.has(key)) cells.set(key, { runs: 0, failed: 0, partials: 0, skipped: 0, violations: 0 });
    return cells.get(key)!;
  };
  const bad: RunOutcome[] = [];
  const t0 = Date.now();
  // plan() cycles kinds then shapes; it is extended in blocks until time or runs are used up.
  let i = 0;
  let block = plan(seed, 22 * 50);
  for (; i < maxRuns && Date.now() < deadline; i++) {
    if (i >= block.length) block = block.concat(plan(seed + block.length, 22 * 50));
    const p = block[i]!;
    const o = await runFault(p.kind, p.shape, p.seed);
    const c = cell(p.kind, p.shape);
    if (o.skipped) {
      c.skipped++;
      continue;
    }
    c.runs++;
    if ((o.senderCode ?? 1) !== 0 || (o.receiverCode ?? 1) !== 0) c.failed++;
    if (o.partialKept) c.partials++;
    c.violations += o.violations.length;
    if (o.violations.length) {
      bad.push(o);
      console.log(`!!!!! ${p.kind} (${p.shape}) seed ${p.seed}:\n  ${o.violations.join('\n  ')}`);
    }
    if ((i + 1) % 22 === 0) console.log(`${i + 1} runs, ${bad.length} with violations, ${((Date.now() - t0) / 60_000).toFixed(1)} min`);
  }
  const totalMs = Date.now() - t0;
  const rows: string[][] = [];
  const sum: Cell = { runs: 0, failed: 0, partials: 0, skipped: 0, violations: 0 };
  for (const k of FAULT_KINDS) {
    for (const s of SHAPES) {
      const c = cells.get(`${k}/${s}`) ?? { runs: 0, failed: 0, partials: 0, skipped: 0, violations: 0 };
      for (const f of Object.keys(sum) as (keyof Cell)[]) sum[f] += c[f];
      rows.push([k, s, String(c.runs), String(c.failed), String(c.partials), String(c.skipped), String(c.violations)]);
    }
  }
  rows.push(['**all**', '', String(sum.runs), String(sum.failed), String(sum.partials), String(sum.skipped), `**${sum.violations}**`]);
  const table = markdown({ head: ['fault', 'shape', 'runs', 'session failed', 'partial kept', 'skipped', 'invariant violations'], rows });
  console.log(table);
  const m = machineInfo(path.join(REPO));
  const figures = [
    FIG_BEGIN,
    `${sum.runs} fault-injected runs in ${(totalMs / 60_000).toFixed(1)} minutes, seed ${seed}: **${sum.violations} invariant violations**.`,
    `Machine: ${m.nproc} cores (${m.cpu}), ${m.memory}, ${m.kernel}, ${m.fs}, Node ${m.node}, commit ${m.commit}, ${m.date}.`,
    '',
    table,
    '',
    '"session failed": the faulted session ended with a non-zero exit on at least one side (the rest were faults',
    'that landed too late to matter, which then had to leave the new content in place); "partial kept": a',
    'resumable `.ffsync-part` survived the fault, and the rerun had to reuse or remove it.',
    '',
    'Reproduce (the same seed replays the same kinds, fixtures and injection points; timings vary):',
    '',
    '```sh',
    `nice ${commandLine()}`,
    '```',
    FIG_END,
  ].join('\n');
  if (!values['no-write']) {
    const file = outFile;
    const old = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '# Reliability\n';
    // Inside the faults section, only the figures (between the inner markers) are replaced:
    // the method and the bugs found around them are written by hand. Without the section,
    // it is appended with the figures alone.
    const a = old.indexOf(BEGIN_MARK);
    const b = a >= 0 ? old.indexOf(END_MARK, a) : -1;
    const fa = a >= 0 ? old.indexOf(FIG_BEGIN, a) : -1;
    const fb = fa >= 0 ? old.indexOf(FIG_END, fa) : -1;
    let next: string;
    if (fa >= 0 && fb > fa && fb < b) next = old.slice(0, fa) + figures + old.slice(fb + FIG_END.length);
    else if (a >= 0 && b > a) next = old.slice(0, a) + `${BEGIN_MARK}\n${figures}\n${END_MARK}` + old.slice(b + END_MARK.length);
    else next = `${old.trimEnd()}\n\n${BEGIN_MARK}\n${figures}\n${END_MARK}\n`;
    fs.writeFileSync(file, next);
    console.log(`wrote ${path.relative(process.cwd(), file)}`);
  }
  process.exitCode = bad.length ? 1 : 0;
}

void main();
