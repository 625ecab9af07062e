#!/usr/bin/env node
// The GitHub Action's last step (action.yml): reads the NDJSON events of the ffsync-native run,
// prints the step outputs (`name=value` lines, appended to $GITHUB_OUTPUT by the caller), and,
// when $GITHUB_STEP_SUMMARY is set, appends a job summary table: files, bytes on the wire, time
// and the comparison with copying the whole artifact. Plain Node, no dependencies (so its own
// small byte formatter): it must report even when installing ffsync-native failed.
'use strict';
const fs = require('node:fs');

/** The last `summary` event of an NDJSON file (lines that are not JSON are skipped). */
function lastSummary(file) {
  let summary;
  let text = '';
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const e = JSON.parse(line);
      if (e.event === 'summary') summary = e;
    } catch {
      // not an event
    }
  }
  return summary;
}

function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${n} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[u]}`;
}

/** Step outputs, one `name=value` per line. */
function outputs(summary, code) {
  const lines = [`exit-code=${code}`];
  if (summary) {
    lines.push(`bytes-sent=${summary.bytesOnWire?.sent ?? ''}`);
    lines.push(`bytes-received=${summary.bytesOnWire?.received ?? ''}`);
    lines.push(`duration-ms=${summary.durationMs ?? ''}`);
    lines.push(`summary=${JSON.stringify(summary)}`);
  }
  return lines.join('\n') + '\n';
}

/** The job summary: a Markdown table. */
function table(summary, code, mode) {
  const rows = [];
  if (!summary) {
    rows.push(['result', `failed before a summary (exit ${code})`]);
  } else {
    const t = summary.tree;
    const wire = (summary.bytesOnWire?.sent ?? 0) + (summary.bytesOnWire?.received ?? 0);
    rows.push(['result', summary.ok ? 'ok' : `failed (exit ${summary.exitCode ?? code}): ${summary.error ?? ''}`]);
    if (t) rows.push(['files', `${t.files} (${t.written} written, ${t.unchanged} unchanged, ${t.deleted} deleted)`]);
    rows.push(['size', bytes(summary.size ?? 0)]);
    rows.push(['on the wire', `${bytes(summary.bytesOnWire?.sent ?? 0)} sent, ${bytes(summary.bytesOnWire?.received ?? 0)} received`]);
    if (summary.size > 0) rows.push(['vs a whole copy', `${((100 * wire) / summary.size).toFixed(1)}% of the bytes (${bytes(summary.size)} for a whole copy)`]);
    rows.push(['literal / reused', `${bytes(summary.literalBytes ?? 0)} / ${bytes(summary.matchedBytes ?? 0)}`]);
    rows.push(['time', `${((summary.durationMs ?? 0) / 1000).toFixed(2)} s`]);
  }
  const esc = (s) => String(s).replace(/\|/g, '\\|').replace(/\n/g, ' ');
  return [`### ffsync-native ${mode}`, '', '| | |', '|---|---|', ...rows.map(([k, v]) => `| ${esc(k)} | ${esc(v)} |`), ''].join('\n') + '\n';
}

if (require.main === module) {
  const [file, code = '1', mode = 'send'] = process.argv.slice(2);
  const summary = lastSummary(file);
  process.stdout.write(outputs(summary, code));
  if (process.env.GITHUB_STEP_SUMMARY) fs.appendFileSync(process.env.GITHUB_STEP_SUMMARY, table(summary, code, mode));
}

module.exports = { lastSummary, outputs, table };
