// Turns SyncEvents into what a person or a script sees: an ora spinner per phase on a
// TTY, plain lines without escape codes otherwise, NDJSON events with --json (human text
// then goes to stderr).

import type { Phase, SyncEvents, SyncSummary } from '../api/events.js';
import { formatBytes, formatRate, rsyncDecimal, rsyncNumber } from '../utils/format.js';

export interface Reporter extends SyncEvents {
  summary(s: SyncSummary): void;
  error(message: string, exitCode: number, summary?: SyncSummary): void;
  stop(): void;
}

type Spinner = { text: string; start(): Spinner; succeed(t?: string): void; stopAndPersist(o: { symbol: string; text: string }): void; stop(): void };

export interface ReporterOptions {
  json: boolean;
  quiet: boolean;
  /** `sync` speaks rsync: silent unless asked (-v, --progress, --stats), `-v` lists changes
   * on stdout in rsync's format. `peer`: send, receive, pull, serve. */
  style?: 'sync' | 'peer';
  /** --progress / -P / --info=progress2: true; --no-progress: false; unset: the default
   * (a spinner on a terminal for send/receive, nothing for sync). */
  progress?: boolean;
  /** Plain progress lines (no terminal) every this many ms. */
  progressIntervalMs?: number;
  verbose?: boolean;
  /** --stats prints the totals itself (and rsync's closing lines with them). */
  stats?: boolean;
  /** sync -v: rsync's first line (`sending incremental file list`, or `receiving` for a pull). */
  listHeader?: string;
  dryRun?: boolean;
  /** sync -i: change lines arrive in rsync's itemized format and are printed as they are. */
  itemize?: boolean;
}

/** Where progress can be drawn in place: a terminal with columns to draw in (a pseudo-terminal
 * with 0 columns, as under `script` or some CI runners, gets plain lines instead). */
export function canDraw(stream: NodeJS.WriteStream): boolean {
  return Boolean(stream.isTTY) && (stream.columns ?? 0) > 0;
}

/** NO_COLOR (https://no-color.org): set and not empty. */
export function noColor(env: NodeJS.ProcessEnv = process.env): boolean {
  return Boolean(env.NO_COLOR);
}

export async function createReporter(opts: ReporterOptions): Promise<Reporter> {
  if (opts.json) return jsonReporter(opts.progress === true && !opts.quiet ? (opts.progressIntervalMs ?? 5000) : undefined);
  const style = opts.style ?? 'peer';
  // stderr last: a quiet run never makes the stream (a pipe's or a terminal's loads net and tty).
  const spinners = !opts.quiet && (style === 'peer' ? opts.progress !== false : opts.progress === true) && canDraw(process.stderr);
  let ora: OraFactory | undefined;
  if (spinners) {
    // ora is ESM-only; load it only when a spinner will be shown (through a file outside the
    // bundle: ./import-esm.ts says why).
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { importEsm } = require('./import-esm') as typeof import('./import-esm');
    ora = ((await importEsm('ora')) as { default: OraFactory }).default;
  }
  return new HumanReporter({ ...opts, style }, ora);
}

/** `m:ss` or `h:mm:ss`. */
function clock(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const mm = String(Math.floor((s % 3600) / 60));
  const ss = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${mm.padStart(2, '0')}:${ss}` : `${mm}:${ss}`;
}

/** One progress line: amount (of the total, with percent, when known), rate, elapsed time, and
 * while the phase runs the time left at the current rate. */
export function progressLine(phase: Phase, done: number, total: number, ms: number, finished = false): string {
  if (phase === 'scanning') return `${phase.padEnd(9)} ${done} ${done === 1 ? 'entry' : 'entries'}  ${(ms / 1000).toFixed(2)} s`;
  const known = total > 0 && done <= total;
  const amount = known && !finished ? `${formatBytes(done)} / ${formatBytes(total)}  ${Math.floor((done / total) * 100)}%` : formatBytes(done);
  const rate = formatRate(done, ms);
  const eta = known && !finished && done > 0 && ms > 0 ? `  ETA ${clock(((total - done) / done) * (ms / 1000))}` : '';
  return `${phase.padEnd(9)} ${amount}${rate ? `  ${rate}` : ''}  ${(ms / 1000).toFixed(2)} s${eta}`;
}

/** A plan line of the core (`mkdir   d/`, `send    f (12 bytes, delta)`, `copy    f (from g, no
 * data sent)`, `link    l -> t`, `attrs   f`, `delete  x`, `skip    f (…)`) as rsync -v lists it:
 * the name (directories with '/'), `l -> t` for a link, `deleting x`. Unknown lines pass as they are. */
export function rsyncListLine(planLine: string): string {
  const m = /^(\w+)\s+(.*)$/.exec(planLine);
  if (!m) return planLine;
  const [, verb, rest] = m as unknown as [string, string, string];
  switch (verb) {
    case 'mkdir':
    case 'link':
    case 'attrs':
      return rest;
    case 'send':
    case 'copy':
      return rest.replace(/ \((?:\d+ bytes(?:, delta)?|from .*, no data sent)\)$/, '');
    case 'delete':
      return `deleting ${rest}`;
    default:
      return planLine;
  }
}

type OraFactory = (o: { text: string; stream: NodeJS.WritableStream; color?: boolean | string }) => Spinner;

/** The phases running at once, drawn on one spinner line (ora on a terminal) or as plain lines
 * every `interval` ms (--progress without a terminal). Phases may overlap (a large file's early
 * DATA goes out while it is still hashed); a phase that ends leaves its final line above it. */
class PhaseDisplay {
  private readonly started = new Map<Phase, { t0: number; total: number; done: number; lastLine: number; ended: boolean }>();
  private spinner: Spinner | undefined;
  private readonly colorless = noColor();

  constructor(
    private readonly ora: OraFactory | undefined,
    /** Plain lines (no spinner) while phases run. */
    private readonly plain: boolean,
    private readonly interval: number,
    private readonly line: (text: string) => void,
  ) {}

  start(phase: Phase, total: number): void {
    this.started.set(phase, { t0: Date.now(), total, done: 0, lastLine: Date.now(), ended: false });
    if (!this.ora) return;
    if (this.spinner) this.spinner.text = this.render();
    else this.spinner = this.spin();
  }

  progress(phase: Phase, done: number): void {
    const s = this.started.get(phase);
    if (!s || s.ended) return;
    s.done = done;
    const now = Date.now();
    if (this.spinner) this.spinner.text = this.render();
    else if (this.plain && now - s.lastLine >= this.interval) {
      s.lastLine = now;
      this.line(progressLine(phase, done, s.total, now - s.t0));
    }
  }

  /** Ends a phase; `alwaysLine`: its final line is printed even without progress shown. */
  end(phase: Phase, done: number, ms: number, alwaysLine: boolean): void {
    const s = this.started.get(phase);
    const text = progressLine(phase, done, s?.total ?? done, ms, true);
    if (s) s.ended = true;
    if (this.spinner) {
      if (this.colorless) this.spinner.stopAndPersist({ symbol: '-', text });
      else this.spinner.succeed(text);
      this.spinner = this.running().length > 0 ? this.spin() : undefined;
    } else if (alwaysLine || this.plain) this.line(text);
  }

  stop(): void {
    this.spinner?.stop();
    this.spinner = undefined;
  }

  private spin(): Spinner {
    return this.ora!({ text: this.render(), stream: process.stderr, ...(this.colorless ? { color: false } : {}) }).start();
  }

  private running() {
    return [...this.started.entries()].filter(([, s]) => !s.ended);
  }

  private render(): string {
    return this.running()
      .map(([phase, s]) => progressLine(phase, s.done, s.total, Date.now() - s.t0))
      .join('   ');
  }
}

/** What a person sees: `sync` speaks rsync (lists and notices on stdout, silent unless asked),
 * the peer commands (send, receive, pull, serve) report each phase and a one-line summary. */
class HumanReporter implements Reporter {
  private readonly phases: PhaseDisplay;
  private headerShown = false;

  constructor(
    private readonly o: ReporterOptions & { style: 'sync' | 'peer' },
    ora?: OraFactory,
  ) {
    const plain = !ora && o.progress === true && !o.quiet;
    this.phases = new PhaseDisplay(ora, plain, o.progressIntervalMs ?? 5000, (line) => this.info(line));
  }

  listening(host: string, port: number): void {
    process.stdout.write(`listening on ${host}:${port}\n`);
  }

  pairing(code: string, command: string): void {
    // On stdout beside the address, even with -q: without it nobody can connect.
    process.stdout.write(pairingText(code, command));
  }

  peer(label: string, fingerprint: string, pinned: boolean): void {
    // First contact: show the fingerprint (a TTY prompt, if any, follows this line).
    if (!pinned) process.stderr.write(`peer ${label} fingerprint ${fingerprint}\n`);
  }

  phaseStart(phase: Phase, total: number): void {
    this.header();
    this.phases.start(phase, total);
  }

  progress(phase: Phase, done: number): void {
    this.phases.progress(phase, done);
  }

  phaseEnd(phase: Phase, done: number, ms: number): void {
    this.phases.end(phase, done, ms, this.o.style === 'peer');
  }

  info(line: string): void {
    if (!this.o.quiet) process.stderr.write(line + '\n');
  }

  notice(line: string): void {
    // rsync prints these on stdout, -v or not.
    if (this.o.style === 'sync') {
      if (!this.o.quiet) process.stdout.write(`${line}\n`);
    } else this.info(line);
  }

  change(line: string, dryRun?: boolean): void {
    const { o } = this;
    if (o.style !== 'sync') return this.info(dryRun ? `would ${line}` : line);
    // rsync: -v (or -i) lists, on stdout; a dry run without either lists nothing.
    if ((o.verbose || o.itemize) && !o.quiet) {
      this.header();
      process.stdout.write(`${o.itemize ? line : rsyncListLine(line)}\n`);
    }
  }

  summary(s: SyncSummary): void {
    const { o } = this;
    if (o.quiet) return;
    if (o.style === 'sync') {
      this.header();
      // --stats prints its own block with these lines; -v alone ends with rsync's two lines.
      if (o.verbose && !o.stats) process.stdout.write(rsyncClosingLines(s, 0, Boolean(o.dryRun)));
      return;
    }
    process.stdout.write(peerSummaryLine(s));
  }

  error(message: string): void {
    this.phases.stop();
    process.stderr.write(`ffsync-native: error: ${message}\n`);
  }

  stop(): void {
    this.phases.stop();
  }

  /** sync -v: rsync's first line, once, before anything it lists. */
  private header(): void {
    const { o } = this;
    if (o.style === 'sync' && o.verbose && o.listHeader && !this.headerShown && !o.quiet) {
      this.headerShown = true;
      process.stdout.write(`${o.listHeader}\n`);
    }
  }
}

/** The peer commands' closing line: what happened to the file or tree, the wire bytes, the time. */
function peerSummaryLine(s: SyncSummary): string {
  const t = s.tree;
  const what = t
    ? `${t.files} ${t.files === 1 ? 'file' : 'files'}, ${t.written} written (${t.localCopies} served locally), ${t.attrsOnly} attributes only, ${t.deleted} deleted, ${t.unchanged} unchanged; ${formatBytes(s.literalBytes)} literal, ${formatBytes(s.matchedBytes)} reused`
    : s.upToDate
      ? `up to date (${s.decidedBy})`
      : `${formatBytes(s.literalBytes)} literal, ${formatBytes(s.matchedBytes)} reused`;
  return `${s.role === 'sender' ? 'sent' : 'received'} ${s.path}: ${t ? '' : formatBytes(s.size) + ', '}${what}; wire ${formatBytes(s.bytesOnWire.sent)} sent, ${formatBytes(s.bytesOnWire.received)} received; ${(s.durationMs / 1000).toFixed(2)} s\n`;
}

/** rsync's closing lines (`-v`, and the end of `--stats`): bytes sent and received with the
 * rate, then the total size and the speedup, `(DRY RUN)` on a dry run; numbers at `human`
 * (0 = rsync's default commas, 1 = -h, 2 = -hh). */
export function rsyncClosingLines(s: SyncSummary, human: number, dryRun: boolean): string {
  const { sent, received } = s.bytesOnWire;
  const n = (x: number) => rsyncNumber(x, human + 1);
  const seconds = Math.max(s.durationMs, 1) / 1000;
  const speedup = sent + received > 0 ? s.size / (sent + received) : 0;
  return (
    `\nsent ${n(sent)} bytes  received ${n(received)} bytes  ${rsyncDecimal((sent + received) / seconds, human + 1)} bytes/sec\n` +
    `total size is ${n(s.size)}  speedup is ${speedup.toFixed(2)}${dryRun ? ' (DRY RUN)' : ''}\n`
  );
}

/** NDJSON on stdout; with `plainEveryMs` (--json --progress, as in a CI job log that also
 * wants the events), plain progress lines go to stderr at that interval too. */
function jsonReporter(plainEveryMs?: number): Reporter {
  const emit = (o: object) => process.stdout.write(JSON.stringify(o) + '\n');
  let lastProgress = 0;
  const phases = new Map<Phase, { t0: number; total: number; lastLine: number }>();
  return {
    listening: (host, port) => emit({ event: 'listening', host, port }),
    pairing: (code, command) => {
      emit({ event: 'pairing', code, command });
      process.stderr.write(pairingText(code, command));
    },
    peer: (label, fingerprint, pinned) => {
      emit({ event: 'peer', peer: label, fingerprint, pinned });
      if (!pinned) process.stderr.write(`peer ${label} fingerprint ${fingerprint}\n`);
    },
    phaseStart: (phase, total) => {
      phases.set(phase, { t0: Date.now(), total, lastLine: Date.now() });
      emit({ event: 'phase', phase, state: 'start', totalBytes: total });
    },
    progress(phase, done) {
      const now = Date.now();
      const p = phases.get(phase);
      if (plainEveryMs !== undefined && p && now - p.lastLine >= plainEveryMs) {
        p.lastLine = now;
        process.stderr.write(`${progressLine(phase, done, p.total, now - p.t0)}\n`);
      }
      if (now - lastProgress < 250) return;
      lastProgress = now;
      emit({ event: 'progress', phase, doneBytes: done });
    },
    phaseEnd: (phase, done, ms) => {
      const p = phases.get(phase);
      if (plainEveryMs !== undefined) process.stderr.write(`${progressLine(phase, done, p?.total ?? done, ms, true)}\n`);
      emit({ event: 'phase', phase, state: 'end', doneBytes: done, durationMs: ms });
    },
    info: (message) => {
      process.stderr.write(message + '\n');
      emit({ event: 'info', message });
    },
    summary: (s) => emit({ event: 'summary', exitCode: 0, ...s }),
    error(message, exitCode, summary) {
      process.stderr.write(`ffsync-native: error: ${message}\n`);
      emit({
        event: 'summary',
        ...(summary ?? { bytesOnWire: { sent: 0, received: 0 }, durationMs: 0 }),
        ok: false,
        exitCode,
        error: message,
      });
    },
    stop() {},
  };
}

/** `--stats`: rsync's fields in rsync's format (numbers as its `-h` level asks: commas by
 * default, units with `-h`), for the totals this tool knows. rsync's file-list lines have no
 * counterpart here and are left out rather than invented. */
export function rsyncStats(s: SyncSummary, human: number, dryRun = false): string {
  const n = (x: number) => rsyncNumber(x, human + 1);
  const t = s.tree;
  const files = t ? `${n(t.files + t.dirs + t.symlinks)} (reg: ${n(t.files)}, dir: ${n(t.dirs)}, link: ${n(t.symlinks)})` : `1 (reg: 1)`;
  // rsync names only the kinds there are, and no list at all for 0. (A single file's summary
  // does not say whether the target existed: the line is left out rather than guessed.)
  const created = (c: { files: number; dirs: number; symlinks: number }): string => {
    const kinds = [
      ['reg', c.files],
      ['dir', c.dirs],
      ['link', c.symlinks],
    ].filter(([, k]) => (k as number) > 0);
    const total = c.files + c.dirs + c.symlinks;
    return total === 0 ? '0' : `${n(total)} (${kinds.map(([name, k]) => `${name}: ${n(k as number)}`).join(', ')})`;
  };
  const transferred = t ? t.smallTransfers + t.largeTransfers + t.localCopies : s.upToDate ? 0 : 1;
  const transferredSize = t ? t.transferBytes : s.upToDate ? 0 : s.size;
  return (
    [
      '',
      `Number of files: ${files}`,
      ...(t ? [`Number of created files: ${created(t.created)}`] : []),
      `Number of deleted files: ${n(t ? t.deleted : 0)}`,
      `Number of regular files transferred: ${n(transferred)}`,
      `Total file size: ${n(s.size)} bytes`,
      `Total transferred file size: ${n(transferredSize)} bytes`,
      `Literal data: ${n(s.literalBytes)} bytes`,
      `Matched data: ${n(s.matchedBytes)} bytes`,
      `Total bytes sent: ${n(s.bytesOnWire.sent)}`,
      `Total bytes received: ${n(s.bytesOnWire.received)}`,
    ].join('\n') + `\n${rsyncClosingLines(s, human, dryRun)}`
  );
}

/** What `receive` shows a user for first contact: the code, and the exact line for the sender. */
export function pairingText(code: string, command: string): string {
  return `pairing code ${code} (one use; pins both sides); on the sender, run:\n  ${command}\n`;
}
