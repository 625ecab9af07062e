// Turns SyncEvents into what a person or a script sees: an ora spinner per phase on a
// TTY, plain lines without escape codes otherwise, NDJSON events with --json (human text
// then goes to stderr).

import type { Phase, SyncEvents, SyncSummary } from '../api/events.js';
import { formatBytes, formatRate } from '../utils/format.js';

export interface Reporter extends SyncEvents {
  summary(s: SyncSummary): void;
  error(message: string, exitCode: number, summary?: SyncSummary): void;
  stop(): void;
}

type Spinner = { text: string; start(): Spinner; succeed(t?: string): void; stop(): void };

export async function createReporter(opts: { json: boolean; quiet: boolean }): Promise<Reporter> {
  if (opts.json) return jsonReporter();
  const tty = Boolean(process.stderr.isTTY) && !opts.quiet;
  let ora: ((o: { text: string; stream: NodeJS.WritableStream }) => Spinner) | undefined;
  if (tty) {
    // ora is ESM-only; load it only when a spinner will be shown.
    ora = (await import('ora')).default as unknown as typeof ora;
  }
  return humanReporter(opts.quiet, ora);
}

function line(phase: Phase, done: number, total: number, ms: number): string {
  if (phase === 'scanning') return `${phase.padEnd(9)} ${done} entries  ${(ms / 1000).toFixed(2)} s`;
  const amount = total > 0 && done < total ? `${formatBytes(done)} / ${formatBytes(total)}` : formatBytes(done);
  return `${phase.padEnd(9)} ${amount}  ${formatRate(done, ms)}  ${(ms / 1000).toFixed(2)} s`;
}

function humanReporter(quiet: boolean, ora?: (o: { text: string; stream: NodeJS.WritableStream }) => Spinner): Reporter {
  const started = new Map<Phase, { t0: number; total: number; spinner?: Spinner }>();
  const err = (s: string) => {
    if (!quiet) process.stderr.write(s + '\n');
  };
  return {
    listening(host, port) {
      process.stdout.write(`listening on ${host}:${port}\n`);
    },
    peer(label, fingerprint, pinned) {
      // First contact: show the fingerprint (a TTY prompt, if any, follows this line).
      if (!pinned) process.stderr.write(`peer ${label} fingerprint ${fingerprint}\n`);
    },
    phaseStart(phase, total) {
      const spinner = ora?.({ text: line(phase, 0, total, 0), stream: process.stderr }).start();
      started.set(phase, { t0: Date.now(), total, spinner });
    },
    progress(phase, done) {
      const s = started.get(phase);
      if (s?.spinner) s.spinner.text = line(phase, done, s.total, Date.now() - s.t0);
    },
    phaseEnd(phase, done, ms) {
      const s = started.get(phase);
      const text = line(phase, done, s?.total ?? done, ms);
      if (s?.spinner) s.spinner.succeed(text);
      else err(text);
    },
    info: err,
    summary(s) {
      const t = s.tree;
      const what = t
        ? `${t.files} files, ${t.written} written (${t.localCopies} served locally), ${t.attrsOnly} attributes only, ${t.deleted} deleted, ${t.unchanged} unchanged; ${formatBytes(s.literalBytes)} literal, ${formatBytes(s.matchedBytes)} reused`
        : s.upToDate
          ? `up to date (${s.decidedBy})`
          : `${formatBytes(s.literalBytes)} literal, ${formatBytes(s.matchedBytes)} reused`;
      if (!quiet) {
        process.stdout.write(
          `${s.role === 'sender' ? 'sent' : 'received'} ${s.path}: ${t ? '' : formatBytes(s.size) + ', '}${what}; wire ${formatBytes(s.bytesOnWire.sent)} sent, ${formatBytes(s.bytesOnWire.received)} received; ${(s.durationMs / 1000).toFixed(2)} s\n`,
        );
      }
    },
    error(message) {
      for (const s of started.values()) s.spinner?.stop();
      process.stderr.write(`ffsync-native: error: ${message}\n`);
    },
    stop() {
      for (const s of started.values()) s.spinner?.stop();
    },
  };
}

function jsonReporter(): Reporter {
  const emit = (o: object) => process.stdout.write(JSON.stringify(o) + '\n');
  let lastProgress = 0;
  return {
    listening: (host, port) => emit({ event: 'listening', host, port }),
    peer: (label, fingerprint, pinned) => {
      emit({ event: 'peer', peer: label, fingerprint, pinned });
      if (!pinned) process.stderr.write(`peer ${label} fingerprint ${fingerprint}\n`);
    },
    phaseStart: (phase, total) => emit({ event: 'phase', phase, state: 'start', totalBytes: total }),
    progress(phase, done) {
      const now = Date.now();
      if (now - lastProgress < 250) return;
      lastProgress = now;
      emit({ event: 'progress', phase, doneBytes: done });
    },
    phaseEnd: (phase, done, ms) => emit({ event: 'phase', phase, state: 'end', doneBytes: done, durationMs: ms }),
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
