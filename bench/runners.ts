// Running the tools the benchmarks compare: one ffsync-native pair (a receiver on a loopback port,
// a sender to it) and one rsync, each timed, with peak RSS, and failing loudly on anything but a
// clean exit. bench/run.ts, tree.ts, refine.ts, gate.ts and overlap.ts share these; each keeps
// only what its scenarios read from the result.

import { performance } from 'node:perf_hooks';
import { CLI, Proc, RSYNC_BIN, describeExit, maxOf, median, parseJsonLine, parseRsyncStats, tail } from './common.js';

/** The fields of a peer's `--json` summary event the benchmarks read (docs/cli.md). */
export interface PeerSummary {
  event: 'summary';
  ok: boolean;
  exitCode: number;
  bytesOnWire: { sent: number; received: number };
  durationMs: number;
  literalBytes?: number;
  matchedBytes?: number;
  decidedBy?: string;
  upToDate?: boolean;
  placedEarlyBytes?: number;
  error?: string;
  /** Present for a directory tree (bench/tree.ts reads it). */
  tree?: Record<string, unknown>;
}

/** The last summary event among a peer's stdout lines. */
export function lastSummary(lines: string[]): PeerSummary | undefined {
  for (let i = lines.length - 1; i >= 0; i--) {
    const o = parseJsonLine(lines[i]!);
    if (o?.event === 'summary') return o as unknown as PeerSummary;
  }
  return undefined;
}

export interface PairOptions {
  label: string;
  src: string;
  dst: string;
  stateR: string;
  stateS: string;
  recvArgs?: string[];
  sendArgs?: string[];
  /** Where /usr/bin/time writes a peer's peak RSS (omitted: not measured). */
  rssFile?: (peer: 'receiver' | 'sender') => string;
  /** Wraps a peer's command line (e.g. `taskset` pinning in bench/overlap.ts). */
  wrap?: (peer: 'receiver' | 'sender', argv: string[]) => string[];
  /** The port the sender dials, given the receiver's (e.g. a delay relay in front of it). */
  via?: (port: number) => Promise<number>;
  /** TLS with each peer pinning the other's fingerprint (`ffsync-native id`); omitted: --plaintext. */
  tls?: { senderFingerprint: string; receiverFingerprint: string };
}

export interface PairRun {
  /** From spawning the receiver until both peers exited (node start-up of both included). */
  wallMs: number;
  /** From spawning the sender until both peers exited. */
  senderToExitMs: number;
  sender: PeerSummary;
  receiver: PeerSummary;
  rssKb: { sender?: number; receiver?: number };
  /** Things worth a note beside the figures (e.g. the peers' wire counters disagree). */
  notes: string[];
}

/**
 * One `receive` / `send --json` pair on 127.0.0.1, --plaintext unless `o.tls` pins the peers. Throws unless both peers exit 0
 * with an ok summary; if one fails, the other gets 10 s before it is killed.
 */
export async function runFfsyncPair(o: PairOptions): Promise<PairRun> {
  const wrap = o.wrap ?? ((_peer, argv) => argv);
  const security = (peer: 'receiver' | 'sender') => (o.tls ? ['--trust', peer === 'receiver' ? o.tls.senderFingerprint : o.tls.receiverFingerprint] : ['--plaintext']);
  const t0 = performance.now();
  const recv = new Proc(
    `${o.label} receiver`,
    wrap('receiver', [process.execPath, CLI, 'receive', o.dst, '0', '--bind', '127.0.0.1', ...security('receiver'), '--json', '--state-dir', o.stateR, ...(o.recvArgs ?? [])]),
    { rssFile: o.rssFile?.('receiver') },
  );
  let send: Proc | undefined;
  try {
    const listening = parseJsonLine(await recv.waitForLine((l) => parseJsonLine(l)?.event === 'listening', 60_000))!;
    const port = Number(listening.port);
    if (!Number.isInteger(port) || port <= 0) throw new Error(`${o.label}: bad listening event ${JSON.stringify(listening)}`);
    const dial = o.via ? await o.via(port) : port;
    const t1 = performance.now();
    const sender = new Proc(
      `${o.label} sender`,
      wrap('sender', [process.execPath, CLI, 'send', o.src, `127.0.0.1:${dial}`, ...security('sender'), '--json', '--state-dir', o.stateS, ...(o.sendArgs ?? [])]),
      { rssFile: o.rssFile?.('sender') },
    );
    send = sender;
    const reap = (self: Proc, other: Proc) =>
      self.exited.then((e) => {
        if (e.code !== 0) setTimeout(() => other.exit || other.kill(), 10_000).unref();
      });
    void reap(sender, recv);
    void reap(recv, sender);
    const [es, er] = await Promise.all([sender.exited, recv.exited]);
    const tEnd = Math.max(es.at, er.at);
    const ssum = lastSummary(sender.lines);
    const rsum = lastSummary(recv.lines);
    const problems: string[] = [];
    if (es.code !== 0) problems.push(`sender ${describeExit(es)}${ssum?.error ? `: ${ssum.error}` : ''}; stderr: ${tail(sender.stderr)}`);
    if (er.code !== 0) problems.push(`receiver ${describeExit(er)}${rsum?.error ? `: ${rsum.error}` : ''}; stderr: ${tail(recv.stderr)}`);
    if (!ssum) problems.push('sender printed no summary');
    else if (!ssum.ok || ssum.exitCode !== 0) problems.push(`sender summary not ok: ${JSON.stringify(ssum)}`);
    if (!rsum) problems.push('receiver printed no summary');
    else if (!rsum.ok || rsum.exitCode !== 0) problems.push(`receiver summary not ok: ${JSON.stringify(rsum)}`);
    if (problems.length) throw new Error(`${o.label}: ffsync-native failed: ${problems.join(' | ')}`);
    const notes: string[] = [];
    const sw = ssum!.bytesOnWire;
    const rw = rsum!.bytesOnWire;
    if (sw.sent !== rw.received || sw.received !== rw.sent) {
      notes.push(`wire counters disagree: sender sent/recv ${sw.sent}/${sw.received}, receiver recv/sent ${rw.received}/${rw.sent}`);
    }
    return {
      wallMs: tEnd - t0,
      senderToExitMs: tEnd - t1,
      sender: ssum!,
      receiver: rsum!,
      rssKb: { sender: await sender.peakRssKb(), receiver: await recv.peakRssKb() },
      notes,
    };
  } catch (e) {
    recv.kill();
    send?.kill();
    throw e;
  }
}

export interface RsyncRun {
  /** From spawn to exit. */
  wallMs: number;
  /** rsync's `--stats` (protocol bytes, without any ssh overhead). */
  stats: ReturnType<typeof parseRsyncStats>;
  /** Its whole stdout (e.g. for "Number of regular files transferred"). */
  out: string;
  /** The largest of its local processes. */
  rssKb?: number;
}

/** `rsync --stats ARGS` to completion; throws with the tail of stderr unless it exits 0. */
export async function runRsync(label: string, args: string[], rssFile?: string): Promise<RsyncRun> {
  const t0 = performance.now();
  const p = new Proc(label, [RSYNC_BIN, '--stats', ...args], { rssFile });
  try {
    const e = await p.exited;
    if (e.code !== 0) throw new Error(`${label}: rsync ${describeExit(e)}; stderr: ${tail(p.stderr)}`);
    const out = p.lines.join('\n');
    return { wallMs: e.at - t0, stats: parseRsyncStats(out), out, rssKb: await p.peakRssKb() };
  } catch (err) {
    p.kill();
    throw err;
  }
}

/** What every timed run of a tool records (bench/run.ts and tree.ts add their own fields). */
export interface TimedSample {
  wallMs: number;
  /** ffsync only: from spawning the sender (receiver already listening) until both peers exited. */
  senderToExitMs?: number;
  wire: { sent: number; received: number };
  summaryMs?: { sender: number; receiver: number };
  /** ffsync: each peer; rsync and cp: the largest local process. */
  rssKb: { sender?: number; receiver?: number; all?: number };
  note?: string;
}

/** One tool's runs of one scenario, or why they stopped. */
export interface ToolRuns<S extends TimedSample> {
  samples: S[];
  error?: string;
  /** false: ran but the result did not match its source; undefined: did not finish. */
  verified?: boolean;
}

/** A tool's runs reduced to one table row: the median time, the last run's wire bytes, the peak RSS of any run. */
export interface Aggregate<S extends TimedSample> {
  ok: boolean;
  wallMs?: number;
  wire?: number;
  sample?: S;
  rssSender?: number;
  rssReceiver?: number;
  rssAll?: number;
}

export function aggregate<S extends TimedSample>(r: ToolRuns<S> | undefined): Aggregate<S> {
  if (!r || r.error || r.samples.length === 0) return { ok: false };
  const last = r.samples[r.samples.length - 1]!;
  return {
    ok: true,
    wallMs: median(r.samples.map((s) => s.wallMs)),
    wire: last.wire.sent + last.wire.received,
    sample: last,
    rssSender: maxOf(r.samples.map((s) => s.rssKb.sender)),
    rssReceiver: maxOf(r.samples.map((s) => s.rssKb.receiver)),
    rssAll: maxOf(r.samples.map((s) => s.rssKb.all)),
  };
}
