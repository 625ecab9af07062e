// Hashing ahead of the conversations (decisions §95).
//
// Sender: between the end of its walk and triage it waits on the network (the TCP and TLS or
// ssh handshakes, then the receiver's manifest: a round trip or more) with its cores idle, and
// a sender without a warm index (a CI runner's fresh state directory) has every changed file
// still to hash once the plan is known. It hashes the files the plan will probably need during
// that wait; triage stops it. A single file's sender hashes its file while the handshakes and
// the receiver's DECISION cross.
//
// Receiver: once both peers have triaged, the old versions its deltas start from are known,
// but each is hashed only when its FILE_BEGIN arrives, half a round trip later and then in the
// sender's order. It hashes them ahead, in plan order, from triage on. Before that, a `receive`
// of a directory waits for its sender with its target already walked (the prewalk) and its
// cores idle: it hashes the files a delta would start from meanwhile, as the sender does with
// its own (decisions §96), and triage hands over to the plan's list.
//
// Each scan runs at the system's idle priority (ffsync_core::background), so it only takes
// cycles the session leaves unused, and lands in the peer's index (the core checks the file's
// identity before and after), where the file's conversation finds the manifest instead of
// hashing the file. A conversation never waits for a scan ahead: the file is claimed, none
// starts for it afterwards, and if one is still running the conversation hashes the file itself
// at normal priority (both write the same index entry, each through a file of its own).

import path from 'node:path';
import { scanFileBackground, type LargeTransferInfo, type NativeTreeSync } from '../native/binding.js';
import { STREAM_WINDOW } from '../protocol/messages.js';
import { joinTreePath } from '../utils/tree-path.js';

/** The sender hashes at most this many bytes ahead: the guess is bounded even when the wait
 * is long (an interactive trust prompt, a slow ssh login). About half a second of two cores. */
export const SENDER_AHEAD_BYTES = 1 << 30;

/** The receiver hashes ahead the first this many bytes of its deltas' old versions (and, while
 * it waits for its sender, of the files a delta would start from): the head start is what it
 * lacked (from then on its conversations keep its cores busy), and a bound keeps what was
 * hashed in the page cache until its reconstruction reads it again. */
export const RECEIVER_AHEAD_BYTES = 256 << 20;

/** Files larger than this stream their manifest while their conversation hashes them
 * (capability STREAM): hashing them ahead would only delay that. */
export const AHEAD_MAX_FILE = STREAM_WINDOW;

/** A tree sends files up to this size whole in batches, hashed as they are read; for a single
 * file, hashing this little ahead saves nothing worth a thread's wake-up. The core's
 * `triage::SMALL_FILE_MAX`, which also bounds the tree's candidates
 * (`__test__/native-constants.test.ts` compares the two). */
export const SMALL_FILE_MAX = 64 * 1024;

/** Scans ahead at once: the background pool's width (one per core, at most two). */
const WIDTH = 2;

/** The next relative path to hash, or undefined when there are no more. */
type Candidates = () => Buffer | undefined;

export class ScanAhead {
  private readonly claimed = new Set<string>();
  /** Files whose scan this started (latin1 keys, as `claimed`). */
  private readonly begun = new Set<string>();
  private stopped = false;
  /** Files hashed into the index by the scans this started (`started` of them). */
  hashed = 0;
  /** Resolves when no scan of this is running any more (stopped, or out of candidates). A scan
   * ahead never holds the event loop open (scanFileBackground): whoever awaits this must. */
  readonly idle: Promise<void>;

  private constructor(
    candidates: Promise<Candidates>,
    private readonly root: string,
    private readonly stateDir: string,
  ) {
    this.idle = candidates.then(
      (next) => Promise.all(Array.from({ length: WIDTH }, () => this.worker(next))).then(() => undefined),
      () => undefined, // the session reports its walk's failure
    );
  }

  /** Sender: the files of the walk that triage will probably keep, in plan order (see
   * NativeTreeSync.scanAheadCandidates), until triage stops it. */
  static sender(walking: Promise<NativeTreeSync>, root: string, stateDir: string, maxBytes = SENDER_AHEAD_BYTES): ScanAhead {
    return ScanAhead.ofWalk(walking, root, stateDir, maxBytes);
  }

  /** Receiver waiting for its sender (`receive` of a directory): the files of its prewalk a
   * delta would start from, the same list a sender makes of its walk (regular files over the
   * small-file limit, up to AHEAD_MAX_FILE, that the index lacks, in plan order), until triage
   * stops it and `receiver` takes over. Which of them the sender changed is not known yet: the
   * guess costs only idle cycles, and what it hashed stays in the index for the next session. */
  static waiting(prewalk: Promise<NativeTreeSync>, root: string, stateDir: string, maxBytes = RECEIVER_AHEAD_BYTES): ScanAhead {
    return ScanAhead.ofWalk(prewalk, root, stateDir, maxBytes);
  }

  private static ofWalk(walking: Promise<NativeTreeSync>, root: string, stateDir: string, maxBytes: number): ScanAhead {
    return new ScanAhead(
      walking.then((tree) => unpack(tree.scanAheadCandidates(AHEAD_MAX_FILE, maxBytes))),
      root,
      stateDir,
    );
  }

  /** Receiver: the old versions of the plan's deltas (`large`, in plan order), resolved as its
   * conversations resolve them; none that `after` (the scan while waiting) began, finished or
   * not: a finished one is in the index, a running one is the conversation's to redo if it
   * must, never a second background scan of the same file. */
  static receiver(large: Iterable<LargeTransferInfo>, root: string, stateDir: string, maxBytes = RECEIVER_AHEAD_BYTES, after?: ScanAhead): ScanAhead {
    const it = large[Symbol.iterator]();
    let listed = 0;
    const next = (): Buffer | undefined => {
      for (let r = it.next(); !r.done && listed < maxBytes; r = it.next()) {
        if (!r.value.delta || r.value.size > AHEAD_MAX_FILE || after?.began(r.value.path)) continue;
        listed += r.value.size;
        return r.value.path;
      }
      return undefined;
    };
    return new ScanAhead(Promise.resolve(next), root, stateDir);
  }

  /** Sender of a single file (`file` is its path): the file, when its conversation would hash it
   * whole (over the small-file limit, not streamed) and `indexed` (the index's answer for it)
   * is null, while the handshakes and the receiver's DECISION cross. */
  static file(file: string, size: bigint, stateDir: string, indexed: Promise<unknown>): ScanAhead | undefined {
    if (size <= SMALL_FILE_MAX || size > AHEAD_MAX_FILE) return undefined;
    let given = false;
    // Only a file the index did not have (asked first: see send.ts, indexedFile).
    const candidates = indexed.then((hit): Candidates => (hit ? () => undefined : () => (given ? undefined : ((given = true), Buffer.from(path.basename(file))))));
    return new ScanAhead(candidates, path.dirname(file), stateDir);
  }

  /** No scan starts after this (those running finish on their own). */
  stop(): void {
    this.stopped = true;
  }

  /** A conversation is about to hash `rel`: no scan ahead starts for it from now on. */
  claim(rel: Buffer): void {
    this.claimed.add(rel.toString('latin1'));
  }

  /** Files whose scan this started. */
  get started(): number {
    return this.begun.size;
  }

  /** Whether a scan of `rel` was started by this (it may still be running). */
  began(rel: Buffer): boolean {
    return this.begun.has(rel.toString('latin1'));
  }

  private async worker(next: Candidates): Promise<void> {
    for (let rel = next(); rel && !this.stopped; rel = next()) {
      const key = rel.toString('latin1');
      if (this.claimed.has(key)) continue;
      this.begun.add(key);
      if (await scanFileBackground(joinTreePath(this.root, rel), this.stateDir)) this.hashed++;
    }
  }
}

/** `{ len u32 LE, path }*` (NativeTreeSync.scanAheadCandidates), one path at a time. */
function unpack(packed: Buffer): Candidates {
  let at = 0;
  return () => {
    if (at + 4 > packed.length) return undefined;
    const n = packed.readUInt32LE(at);
    const rel = packed.subarray(at + 4, at + 4 + n);
    at += 4 + n;
    return rel;
  };
}
