// Early placement on the receiver (capability STREAM, docs/protocol.md §4.15): while a large
// file's manifest streams in, the chunks the receiver already has are copied into a
// provisional file, and early DATA (an empty basis) is written there, so the rebuild overlaps
// the sender's scan (crates/ffsync_core/src/restore/prefill.rs).

import { protocolError } from '../protocol/frames.js';
import {
  beginPrefill,
  call,
  type NativePrefill,
  type ScanResult,
} from '../native/binding.js';
import { MANIFEST_HEADER } from '../utils/manifest.js';
import { countRecords } from '../protocol/chunk-records.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import type { ReceiveContentOptions } from './content-receive.js';

/** At most this many DATA batches are being verified/written natively at once. */
export const WRITES_IN_FLIGHT = 2;

/** Early placement while MANIFEST_STREAM frames (and early DATA) arrive: one chain of
 * native calls, in order. While the entries so far are exactly the old target's, nothing is
 * placed: a file whose content is unchanged (only its mtime differs) must not cost a copy
 * that is thrown away. */
export class EarlyPlacement {
  private prefill?: NativePrefill;
  private chain: Promise<void> = Promise.resolve();
  /** Fatal: a malformed stream or early DATA (exit 12), or early DATA we could not store. */
  private failure?: Error;
  private rejectFailed!: (e: Error) => void;
  /** Rejects with the failure the moment it happens: the frame loop races it, so a bad batch
   * ends the session now, not when the next frame arrives. */
  readonly failed = new Promise<never>((_, reject) => (this.rejectFailed = reject));
  private off = false;
  /** The session failed or ended: a drain still waiting for the receiver's own scan must not
   * start placing (a copy that would only be thrown away). */
  private stopped = false;
  /** At least one MANIFEST_STREAM frame came (early DATA may only follow entries). */
  private sawEntries = false;
  /** Entries held back while they equal the old target's, and where they end in its list. */
  private held: Buffer[] = [];
  private heldBytes = 0;
  private sameAsTarget: boolean;
  /** Early DATA is counted, not placed (a tree file that will be refused). */
  private discarding = false;
  /** Early DATA taken so far (for DATA_END's totals). */
  readonly received = { chunks: 0, raw: 0 };
  /** Bytes copied into place from local files so far. */
  copied = 0;
  private pending = 0;
  constructor(
    private readonly o: ReceiveContentOptions,
    /** We told the sender (BASIS) that we have nothing: early DATA will come. */
    private readonly expectData: boolean,
  ) {
    this.failed.catch(() => undefined); // reported through `failure` when nobody races it
    // Nothing local to place from and no early DATA, or --inplace (never a whole copy).
    this.off = o.inplace === true || (o.localPaths.length === 0 && !expectData);
    // localPaths[0] is the old target whenever it is reusable and there is a basis at all
    // (`-W` keeps the target but builds from nothing).
    this.sameAsTarget = o.targetReusable && o.localPaths.length > 0;
  }

  /** Entries waiting for the chain: taken all at once, so a backlog (the receiver's own scan
   * finished after several windows arrived) becomes one parallel placement, not many. */
  private queued: Buffer[] = [];

  add(part: Buffer): void {
    this.sawEntries = true;
    if (this.off) return;
    this.queued.push(part);
    if (this.queued.length > 1) return; // a drain is already scheduled
    this.chain = this.chain.then(async () => {
      if (this.off || this.failure || this.stopped) return;
      try {
        const scanned = await this.o.locals;
        if (this.stopped) return;
        const entries = this.queued.length === 1 ? this.queued[0] : Buffer.concat(this.queued);
        this.queued = [];
        if (this.sameAsTarget) {
          const old = scanned[0].manifest;
          const at = MANIFEST_HEADER + this.heldBytes;
          if (old.length >= at + entries.length && old.subarray(at, at + entries.length).equals(entries)) {
            this.held.push(entries);
            this.heldBytes += entries.length;
            return;
          }
          this.sameAsTarget = false;
          if (this.heldBytes) await this.place(scanned, Buffer.concat(this.held));
          this.held = [];
        }
        await this.place(scanned, entries);
      } catch (e) {
        // Entries that cannot belong to the offered file are the sender's fault (exit 12);
        // anything else (a local scan that failed, no room for the temp file) only ends
        // early placement: the normal plan reports it, if it matters, with its own error.
        const code = (e as FfsyncError).code;
        if (code === 'EMALFORMED') this.fail(protocolError(`bad MANIFEST_STREAM: ${(e as Error).message}`));
        // A tree file we cannot write (permission, a name the filesystem refuses) is
        // refused after the manifest like any other; its early DATA is counted and dropped.
        else if (this.expectData && this.o.refusable && code !== 'ENOSPC') this.discarding = true;
        else if (this.expectData) this.fail(e as Error);
        this.off = true;
        this.prefill?.release();
        this.prefill = undefined;
      }
    });
  }

  /** Early DATA (only after BASIS said "empty"): verified and written in place natively.
   * Resolves when at most one more batch is queued (the socket waits meanwhile). */
  async addBatch(batch: Buffer, release?: () => void): Promise<void> {
    if (!this.expectData) {
      release?.();
      throw protocolError('DATA before the manifest is complete, but the receiver did not ask for early DATA');
    }
    if (!this.sawEntries) {
      release?.();
      throw protocolError('bad early DATA: it came before any MANIFEST_STREAM entry');
    }
    this.pending++;
    const p = (this.chain = this.chain.then(async () => {
      // One of the session's write slots for the write itself, not while the batch waits in this
      // chain behind the one before it (decisions §82).
      const slots = this.o.writeSlots;
      if (slots) await slots.acquire(1);
      try {
        if (this.failure) return;
        if (this.discarding) {
          const n = countRecords(batch, 'early DATA');
          this.received.chunks += n.chunks;
          this.received.raw += n.raw;
          return;
        }
        if (this.off || !this.prefill) throw new FfsyncError('EIO', ExitCode.FILE_IO, 'early DATA arrived but could not be placed');
        const r = await call(this.prefill.addBatch(batch));
        this.received.chunks += r.chunks;
        this.received.raw += r.rawBytes;
        this.o.events?.progress?.('receiving', this.received.raw);
      } catch (e) {
        const code = (e as FfsyncError).code;
        // A chunk that fails its hash keeps its code: the sender may say its source changed.
        if (code === 'ECHUNK') this.fail(new FfsyncError('ECHUNK', ExitCode.PROTOCOL_STREAM, `bad early DATA: ${(e as Error).message}`));
        else this.fail(code === 'EMALFORMED' ? protocolError(`bad early DATA: ${(e as Error).message}`) : (e as Error));
      } finally {
        slots?.release(1);
        release?.();
        this.pending--;
      }
    }));
    if (this.pending > WRITES_IN_FLIGHT) await p;
    if (this.failure) throw this.failure;
  }

  private async place(scanned: ScanResult[], entries: Buffer): Promise<void> {
    if (!this.prefill) {
      this.prefill = await beginPrefill(
        this.o.target,
        Number(this.o.size),
        this.o.localPaths.map((p, i) => ({ path: p, manifest: scanned[i].manifest })),
        this.o.beneath,
        this.o.fsync,
      );
    }
    if (!this.prefill.active) {
      this.off = true;
      return;
    }
    this.copied += await call(this.prefill.addEntries(entries));
  }

  private fail(e: Error): void {
    if (this.failure) return;
    this.failure = e;
    this.rejectFailed(e);
  }

  /** The reason placement failed, if it did, else `e`: a sender whose early DATA was bad
   * and who then hung up is reported for its data, not for hanging up. */
  async failureOr(e: unknown): Promise<unknown> {
    await this.chain.catch(() => undefined);
    return this.failure ?? e;
  }

  /** Waits for placement to finish; the prefill to adopt, if any. */
  async done(): Promise<NativePrefill | undefined> {
    await this.chain;
    if (this.failure) throw this.failure;
    return this.prefill;
  }

  /** Error paths: no new placement starts; resolves once the native calls in flight ended. */
  async stop(): Promise<void> {
    this.stopped = true;
    await this.chain.catch(() => undefined);
  }

  /** Placement is still running (not yet handed to the reconstruction). Only after `stop` or
   * `done`: `active` waits for a native placement call in progress. */
  get placing(): boolean {
    return this.prefill?.active === true;
  }

  /** Ends placement (after `done`, or on an error path): removes an unadopted file, or keeps
   * it for a resume after a dropped connection. */
  async release(keep = false): Promise<void> {
    await this.stop();
    this.prefill?.release(keep);
  }
}
