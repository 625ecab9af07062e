// What the shell reads of a chunk batch (a DATA frame's payload, §4.7) without decoding it:
// record headers only. Decoding, verification and writing are the core's.
import { protocolError } from './frames.js';

/** A chunk record's header (§4.7): index u32 | encoding u8 | raw length u32 | payload length u32. */
export const RECORD_HEADER = 13;

/** Record encodings whose zstd stream starts with the file's previous DATA frame as history
 * (capability BATCH_PREFIX, §4.7): the core's chunk_batch::refers_to_previous
 * (__test__/native-constants.test.ts checks they agree). */
export const PREFIX_ENCODINGS: readonly number[] = [8, 9];

/** Chunks and raw bytes in a chunk batch, from its record headers alone. */
export function countRecords(batch: Buffer, what: string): { chunks: number; raw: number } {
  let chunks = 0;
  let raw = 0;
  for (let at = 0; at < batch.length; chunks++) {
    if (batch.length - at < RECORD_HEADER) throw protocolError(`bad ${what}: truncated record header`);
    raw += batch.readUInt32LE(at + 5);
    at += RECORD_HEADER + batch.readUInt32LE(at + 9);
    if (at > batch.length) throw protocolError(`bad ${what}: a record runs past the frame`);
  }
  return { chunks, raw };
}

/** True if a record of the batch refers to the previous DATA frame: the receiver writes it
 * only after every earlier frame of the file was written (the core reads that history back
 * from what it wrote). A malformed batch answers false; the core refuses it. */
export function refersToPrevious(batch: Buffer): boolean {
  for (let at = 0; batch.length - at >= RECORD_HEADER; at += RECORD_HEADER + batch.readUInt32LE(at + 9)) {
    if (PREFIX_ENCODINGS.includes(batch[at + 4])) return true;
  }
  return false;
}
