// One writer at a time per file (decisions §76), observed on a real receiver with strace.
//
// The receiver hashes chunks on several threads; if they also write the same file at the same
// time, the kernel serializes them on the file's inode lock and the waiting thread spins there,
// burning CPU the sender needs. strace -f shows a call that another thread's call interrupts as
// `<unfinished ...>`: two writes into the same temp file in flight at once are exactly that.
// io_uring is turned off so the writes are visible system calls (pwrite64, the portable path).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { modify, run, seeded, sha256, tmpdir } from './helpers/peers';
import { straceMissing, traced } from './helpers/strace';

const MiB = 1024 * 1024;
// fallocate: reserving space ahead of the data takes the inode lock as a write does.
const WRITES = 'pwrite64,pwritev,pwritev2,copy_file_range,fallocate';

/** The file a traced write goes into: the first descriptor's path for pwrite* and fallocate, the second
 * (the destination) for copy_file_range. */
function writtenFile(name: string, args: string): string | undefined {
  const paths = [...args.matchAll(/\d+<([^>]*)>/g)].map((m) => m[1]!);
  return name === 'copy_file_range' ? paths[1] : paths[0];
}

/** Writes into one file that overlapped in time, as `file: call, call` lines; how many writes
 * went into temp files at all, and how many of them were in-kernel copies. */
function overlappingWrites(log: string): { overlaps: string[]; writes: number; copies: number } {
  const inFlight = new Map<string, { file: string; line: string }>();
  const overlaps: string[] = [];
  let writes = 0;
  let copies = 0;
  for (const line of fs.readFileSync(log, 'utf8').split('\n')) {
    const resumed = /^(\d+)\s+<\.\.\. \w+ resumed>/.exec(line);
    if (resumed) {
      inFlight.delete(resumed[1]!);
      continue;
    }
    const call = /^(\d+)\s+(\w+)\((.*)$/.exec(line);
    if (!call) continue;
    const [, pid, name, args] = call as unknown as [string, string, string, string];
    const file = writtenFile(name, args);
    if (!file?.endsWith('.ffsync-part')) continue;
    writes++;
    if (name === 'copy_file_range') copies++;
    for (const [other, w] of inFlight) {
      if (other !== pid && w.file === file) overlaps.push(`${path.basename(file)}: ${w.line.slice(0, 120)} … / ${line.slice(0, 120)} …`);
    }
    if (line.includes('<unfinished ...>')) inFlight.set(pid, { file, line });
  }
  return { overlaps, writes, copies };
}

async function tracedSend(dir: string, src: string, dst: string, round: string): Promise<string> {
  const log = path.join(dir, `${round}.strace`);
  const recv = traced(log, WRITES, ['receive', dst, '0', '--bind', '127.0.0.1', '--plaintext', '--json', '--timeout', '60', '--state-dir', path.join(dir, 'sr'), '--no-fsync'], {
    FFSYNC_NO_IO_URING: '1',
  });
  const port = await Promise.race([recv.listening, recv.done.then((r) => assert.fail(`receiver exited: ${r.stderr}`))]);
  const s = await run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--json', '--timeout', '60', '--state-dir', path.join(dir, 'ss')]).done;
  assert.equal(s.code, 0, `sender: ${s.stderr}`);
  const r = await recv.done;
  assert.equal(r.code, 0, `receiver: ${r.stderr}`);
  assert.equal(sha256(dst), sha256(src), `${round}: verified content`);
  return log;
}

describe('one writer at a time per file', { skip: straceMissing() }, () => {
  it('received chunks (early DATA and batches) and local copies never go into one file at once', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src.bin');
    const dst = path.join(dir, 'dst.bin');
    const old = seeded(48 * MiB, 76);
    fs.writeFileSync(src, old);
    // Fresh: every chunk arrives (early DATA, hashed on the pool). Modified: most of the file
    // is copied from the old one in runs of up to 16 MiB, the edits arrive as batches.
    const fresh = overlappingWrites(await tracedSend(dir, src, dst, 'fresh'));
    fs.writeFileSync(src, modify(old, 77, { overwrites: 12, inserts: 3, deletes: 3 }));
    const modified = overlappingWrites(await tracedSend(dir, src, dst, 'modified'));
    // The trace saw the writes (a fresh 48 MiB file is well over 100 chunk writes), so an
    // empty overlap list means something.
    assert.ok(fresh.writes >= 100, `fresh: ${fresh.writes} traced writes into the temp file`);
    assert.ok(modified.copies >= 2, `modified: ${modified.copies} traced copies from the old file`);
    assert.deepEqual(fresh.overlaps, [], 'fresh: writes into one file overlapped');
    assert.deepEqual(modified.overlaps, [], 'modified: writes into one file overlapped');
  });
});
