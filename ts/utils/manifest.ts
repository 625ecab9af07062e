// Read-only views into a packed manifest (layout in docs/protocol.md). The buffer has
// been validated natively before any of these are used.

export const MANIFEST_HEADER = 64;
export const MANIFEST_ENTRY = 36;

export function manifestChunkCount(m: Buffer): number {
  return m.readUInt32LE(20);
}

export function manifestChunkLength(m: Buffer, i: number): number {
  return m.readUInt32LE(MANIFEST_HEADER + i * MANIFEST_ENTRY);
}

/** Group chunk indices into batches of at most `maxBytes` raw bytes (at least one each). With
 * `firstBytes` (below `maxBytes`) the first batch holds at most that and each next one twice the
 * one before, up to `maxBytes` (see BatchRamp). */
export function batchByBytes(m: Buffer, indices: Uint32Array, maxBytes: number, firstBytes = maxBytes): Uint32Array[] {
  const out: Uint32Array[] = [];
  let limit = Math.min(firstBytes, maxBytes);
  let start = 0;
  let bytes = 0;
  for (let k = 0; k < indices.length; k++) {
    const len = manifestChunkLength(m, indices[k]);
    if (k > start && bytes + len > limit) {
      out.push(indices.subarray(start, k));
      start = k;
      bytes = 0;
      limit = Math.min(limit * 2, maxBytes);
    }
    bytes += len;
  }
  if (start < indices.length) out.push(indices.subarray(start));
  return out;
}

/** The (min, avg, max) chunking parameters a manifest was built with, as one key. */
export function manifestParamsKey(m: Buffer): string {
  return `${m.readUInt32LE(8)}/${m.readUInt32LE(12)}/${m.readUInt32LE(16)}`;
}
