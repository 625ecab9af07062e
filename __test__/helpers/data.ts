// Deterministic data and verification, shared by the tests and the benchmarks: one seeded
// generator (xorshift128, a stream per purpose), seeded files and edits, SHA-256 of files and
// of whole trees, and the comparison of two trees' hashes.

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const KiB = 1024;
const MiB = 1024 * KiB;


/** A 32-bit seed from a name (FNV-1a), for fixtures named rather than numbered. */
export function seedOf(name: string): number {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(name, 'utf8')) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}

export class XorShift128 {
  private x: number;
  private y: number;
  private z: number;
  private w: number;

  constructor(seed: number, stream: number) {
    let st = (seed ^ Math.imul(stream + 1, 0x632be5ab)) | 0;
    const mix = (): number => {
      st = (st + 0x9e3779b9) | 0;
      let z = st;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.x = mix();
    this.y = mix();
    this.z = mix();
    this.w = mix();
    if ((this.x | this.y | this.z | this.w) === 0) this.w = 1;
  }

  next(): number {
    const t = this.x ^ (this.x << 11);
    this.x = this.y;
    this.y = this.z;
    this.z = this.w;
    this.w = (this.w ^ (this.w >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
    return this.w;
  }

  /** Uniform-ish integer in [0, n) for n <= 2^32 (modulo bias is irrelevant here). */
  below(n: number): number {
    if (n <= 0) return 0;
    if (n <= 0x100000000) return this.next() % n;
    return (this.next() * 0x100000000 + this.next()) % n;
  }

  /** Fills buf with the stream's next bytes (little-endian words, on every platform). */
  fill(buf: Buffer): void {
    const words = buf.length >>> 2;
    if ((buf.byteOffset & 3) === 0) {
      const u = new Uint32Array(buf.buffer, buf.byteOffset, words);
      let x = this.x, y = this.y, z = this.z, w = this.w;
      for (let i = 0; i < words; i++) {
        const t = x ^ (x << 11);
        x = y;
        y = z;
        z = w;
        w = (w ^ (w >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
        u[i] = w;
      }
      this.x = x;
      this.y = y;
      this.z = z;
      this.w = w;
      if (os.endianness() === 'BE') buf.subarray(0, words * 4).swap32();
    } else {
      for (let i = 0; i < words; i++) buf.writeUInt32LE(this.next(), i * 4);
    }
    for (let i = words * 4; i < buf.length; i++) buf[i] = this.next() & 0xff;
  }
}


/** A file of `size` seeded pseudo-random bytes (incompressible). */
export function writeSeededFile(file: string, size: number, seed: number): void {
  const rng = new XorShift128(seed, 2);
  const fd = fs.openSync(file, 'w');
  const buf = Buffer.alloc(4 * MiB);
  for (let done = 0; done < size; done += buf.length) {
    rng.fill(buf);
    fs.writeSync(fd, buf, 0, Math.min(buf.length, size - done));
  }
  fs.closeSync(fd);
}

/** Scattered 64 KiB overwrites, one per 16 MiB (the contract's "modified"); mtime = now. */
export function modifyScattered(file: string, seed: number): void {
  const rng = new XorShift128(seed, 3);
  const size = fs.statSync(file).size;
  const fd = fs.openSync(file, 'r+');
  const buf = Buffer.alloc(64 * KiB);
  for (let at = 0; at + buf.length < size; at += 16 * MiB) {
    rng.fill(buf);
    fs.writeSync(fd, buf, 0, buf.length, at + rng.below(Math.min(16 * MiB, size - at) - buf.length));
  }
  fs.closeSync(fd);
  const t = Date.now() / 1000;
  fs.utimesSync(file, t, t);
}

/** SHA-256 of a file without blocking the event loop: read whole when `size` (if known) is
 * at most 4 MiB, else streamed in 4 MiB pieces. */
export async function sha256Async(file: string, size?: number): Promise<string> {
  const h = createHash('sha256');
  if (size !== undefined && size <= 4 * MiB) h.update(await fs.promises.readFile(file));
  else for await (const chunk of fs.createReadStream(file, { highWaterMark: 4 * MiB })) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** SHA-256 of a file, read in 4 MiB pieces (files of any size). */
export function sha256(file: string): string {
  const h = createHash('sha256');
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.allocUnsafe(4 * MiB);
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
    }
  } finally {
    fs.closeSync(fd);
  }
  return h.digest('hex');
}

/** SHA-256 of every regular file under root, by relative path (root itself may be a file: key ''). */
export function hashTree(root: string): Map<string, string> {
  const out = new Map<string, string>();
  if (!fs.existsSync(root)) return out;
  if (fs.statSync(root).isFile()) return out.set('', sha256(root));
  const walk = (d: string, rel: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p, `${rel}${e.name}/`);
      else if (e.isFile()) out.set(`${rel}${e.name}`, sha256(p));
    }
  };
  walk(root, '');
  return out;
}

/** Files whose content differs from `want` (changed), that are missing, or that `want` lacks (extra). */
export function diffHashes(want: Map<string, string>, got: Map<string, string>): { changed: string[]; missing: string[]; extra: string[] } {
  const changed: string[] = [];
  const missing: string[] = [];
  for (const [k, v] of want) {
    const g = got.get(k);
    if (g === undefined) missing.push(k);
    else if (g !== v) changed.push(k);
  }
  const extra = [...got.keys()].filter((k) => !want.has(k));
  return { changed, missing, extra };
}

/** Hash of every regular file under root (relative path + content), for verification. */
export function treeDigest(root: string): string {
  const h = createHash('sha256');
  for (const [k, v] of [...hashTree(root)].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))) h.update(`${k}\0${v}\n`);
  return h.digest('hex');
}
