// Tree entries name files by raw bytes (Linux names need not be UTF-8). Node's fs accepts
// Buffer paths, so a path stays bytes unless it round-trips through UTF-8 unchanged.

import path from 'node:path';

/** `root` joined with a '/'-separated relative path of bytes. */
export function joinTreePath(root: string, rel: Buffer): string | Buffer {
  const text = rel.toString('utf8');
  if (Buffer.from(text, 'utf8').equals(rel)) return path.join(root, ...text.split('/'));
  if (process.platform === 'win32') return path.join(root, text);
  return Buffer.concat([Buffer.from(root.endsWith('/') ? root : root + '/', 'utf8'), rel]);
}

/** Printable form of a relative path (invalid UTF-8 shown as replacement characters). */
export function showTreePath(rel: Buffer): string {
  return rel.toString('utf8');
}
