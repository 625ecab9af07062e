// Durable writes and `--no-fsync`, observed on real processes with strace: by default a
// received file's temp is fsynced before it is renamed over the target (a tree also syncs
// its filesystem before it reports success); with --no-fsync nothing is fsynced or synced and
// nothing waits for writeback, which is only started as data lands (decisions §115: on ext4 a
// rename over an old version would otherwise start, and wait for, all of it), and the result
// is still verified and identical.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { assertSameTree, CLI, run, type PeerResult, seeded, sha256, T0, tmpdir, writeAt } from './helpers/peers';
import { type Sshd, startSshd, sshdUnavailable } from './helpers/sshd';
import { type Call, calls, straceMissing, traced as tracedWith } from './helpers/strace';

const MiB = 1024 * 1024;
const TRACED = 'fsync,fdatasync,syncfs,sync_file_range,rename,renameat,renameat2';

/** The CLI under strace, tracing the calls that flush or rename. */
const traced = (log: string, args: string[]) => tracedWith(log, TRACED, args);

const isFlush = (c: Call) => c.name === 'fsync' || c.name === 'fdatasync';
/** A call that waits for the disk: a flush, a sync, or a writeback that waits (`SYNC_FILE_RANGE_WAIT_*`). */
const waitsForDisk = (c: Call) => isFlush(c) || c.name === 'syncfs' || (c.name === 'sync_file_range' && c.line.includes('WAIT'));
/** Writeback started on a temp file (never waiting). */
const startsWriteback = (c: Call) => c.name === 'sync_file_range' && !c.line.includes('WAIT') && c.line.includes('.ffsync-part>');

/** Where the temp file of `target` (…/.name.<root>.ffsync-part) was renamed to `target`:
 * the index of that rename, and of the flush of the same temp on the same thread before it. */
function commitOrder(cs: Call[], target: string): { rename: number; flush: number } {
  const name = path.basename(target);
  const rename = cs.findIndex((c) => c.name.startsWith('rename') && c.line.includes(`.ffsync-part", `) && c.line.includes(`"${name}")`));
  assert.ok(rename >= 0, `no rename of a temp file to ${name} in the trace`);
  const temp = /"(\.[^"]*\.ffsync-part)"/.exec(cs[rename]!.line)![1]!;
  const flush = cs.findIndex((c, i) => i < rename && isFlush(c) && c.pid === cs[rename]!.pid && c.line.includes(`/${temp}>`));
  return { rename, flush };
}

function assertOk(r: PeerResult, what: string) {
  assert.equal(r.code, 0, `${what}: exit ${r.code} (signal ${r.signal}): ${r.stderr}`);
  if (r.summary) assert.equal(r.summary.ok, true, `${what}: summary not ok`);
}

/** One send → receive of `src` into `dst`, the receiver traced. */
async function sendReceive(dir: string, src: string, dst: string, recvArgs: string[]): Promise<Call[]> {
  const log = path.join(dir, `recv-${path.basename(dst)}.strace`);
  const recv = traced(log, ['receive', dst, '0', '--bind', '127.0.0.1', '--plaintext', '--json', '--timeout', '60', '--state-dir', path.join(dir, 'sr'), ...recvArgs]);
  const port = await Promise.race([recv.listening, recv.done.then((r) => assert.fail(`receiver exited: ${r.stderr}`))]);
  const s = await run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--json', '--timeout', '60', '--state-dir', path.join(dir, 'ss')]).done;
  assertOk(s, 'sender');
  assertOk(await recv.done, 'receiver');
  assert.equal(sha256(dst), sha256(src), 'verified content');
  return calls(log);
}

/** A tree with small files and one large file (chunk conversation), explicit modes and mtimes. */
function buildTree(src: string) {
  for (let i = 0; i < 20; i++) writeAt(src, `small/f${i}.txt`, seeded(3000 + i, i), 0o644, T0 + i);
  writeAt(src, 'big/large.bin', seeded(6 * MiB, 77), 0o640, T0 + 50);
  writeAt(src, 'top.txt', 'top\n', 0o600, T0 + 60);
}

/** Index of the last rename of anything under `dir`. */
function lastRenameUnder(cs: Call[], dir: string): number {
  return cs.map((c, i) => (c.name.startsWith('rename') && under(dir)(c) ? i : -1)).reduce((a, b) => Math.max(a, b), -1);
}

const under = (dir: string) => (c: Call) => c.line.includes(`<${dir}/`) || c.line.includes(`<${dir}>`);

describe('durable writes and --no-fsync', { skip: straceMissing() }, () => {
  it('send/receive: the temp file is fsynced before it is renamed over the target', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(12 * MiB, 5));
    const dst = path.join(dir, 'dst.bin');
    const cs = await sendReceive(dir, src, dst, []);
    const { rename, flush } = commitOrder(cs, dst);
    assert.ok(flush >= 0 && flush < rename, `no fsync of the temp file before its rename:\n${cs.map((c) => c.line).join('\n')}`);
    // A fresh 12 MiB file: writeback started while its data landed, before that fsync.
    assert.ok(cs.slice(0, flush).some((c) => c.name === 'sync_file_range' && c.line.includes('.ffsync-part>')), 'writeback started early');
  });

  it('send/receive --no-fsync: renamed without any fsync or wait for the disk, writeback only started, content verified', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(12 * MiB, 6));
    const dst = path.join(dir, 'dst.bin');
    // Fresh, then modified (local copies from the old file plus received chunks).
    for (const round of [0, 1]) {
      if (round === 1) {
        const b = fs.readFileSync(src);
        b.fill(0x42, 5 * MiB, 5 * MiB + 300_000);
        fs.writeFileSync(src, b);
      }
      const cs = await sendReceive(dir, src, dst, ['--no-fsync']);
      const { rename } = commitOrder(cs, dst);
      assert.ok(rename >= 0);
      const mine = (c: Call) => under(dir)(c) && !c.line.includes(`<${dir}/sr`);
      const waited = cs.filter((c) => waitsForDisk(c) && mine(c));
      assert.deepEqual(waited.map((c) => c.line), [], `round ${round}: nothing of the target's directory is flushed or waited for`);
      // Writeback of the 12 MiB is handed to the kernel as it lands, before the rename.
      assert.ok(cs.slice(0, rename).some((c) => startsWriteback(c) && mine(c)), `round ${round}: writeback started before the rename`);
    }
  });

  it('local sync of a tree: files durable (syncfs) before success; --no-fsync skips it and converges the same', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildTree(src);
    for (const noFsync of [false, true]) {
      const dst = path.join(dir, noFsync ? 'dst-nofsync' : 'dst');
      const log = path.join(dir, `${path.basename(dst)}.strace`);
      const r = await traced(log, ['sync', '-a', '--json', '--state-dir', path.join(dir, `state-${noFsync}`), ...(noFsync ? ['--no-fsync'] : []), `${src}/`, `${dst}/`]).done;
      assertOk(r, `sync${noFsync ? ' --no-fsync' : ''}`);
      assertSameTree(dst, src);
      const cs = calls(log);
      const syncfs = cs.filter((c) => c.name === 'syncfs');
      const large = commitOrder(cs, path.join(dst, 'big/large.bin'));
      if (noFsync) {
        assert.equal(syncfs.length, 0, 'no syncfs');
        assert.equal(large.flush, -1, 'the large file is not fsynced');
        assert.deepEqual(cs.filter((c) => waitsForDisk(c) && under(dst)(c)).map((c) => c.line), []);
        // The large file (6 MiB, written whole) has its writeback started before its rename.
        assert.ok(cs.slice(0, large.rename).some((c) => startsWriteback(c) && under(dst)(c)), 'writeback of the large file started before its rename');
      } else {
        assert.ok(large.flush >= 0 && large.flush < large.rename, 'the large file is fsynced before its rename');
        assert.ok(syncfs.length >= 1, 'the tree is synced');
        // After every file is in place: the last rename under dst comes before the last syncfs.
        assert.ok(cs.indexOf(syncfs.at(-1)!) > lastRenameUnder(cs, dst), 'syncfs after the last rename');
      }
    }
  });

  it('a tree of many small files is flushed in batches while it is written, and synced at the end', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    // 1200 files of 60,000 bytes: past one 64 MiB flush batch.
    for (let i = 0; i < 1200; i++) writeAt(src, `d${i % 12}/f${i}`, seeded(60_000, 1000 + i), 0o644, T0);
    const dst = path.join(dir, 'dst');
    const log = path.join(dir, 'many.strace');
    assertOk(await traced(log, ['sync', '-a', '--json', '--state-dir', path.join(dir, 'state'), `${src}/`, `${dst}/`]).done, 'sync');
    assertSameTree(dst, src);
    const cs = calls(log);
    const syncfs = cs.map((c, i) => (c.name === 'syncfs' ? i : -1)).filter((i) => i >= 0);
    const last = lastRenameUnder(cs, dst);
    assert.ok(syncfs.some((i) => i < last), `a batch flush ran while files were still being written (syncfs at ${syncfs}, last rename at ${last})`);
    assert.ok(syncfs.at(-1)! > last, 'and one after the last rename');
  });

  it('--no-fsync is offered by receive, sync, pull and serve', async () => {
    for (const cmd of ['receive', 'sync', 'pull', 'serve']) {
      const r = await run([cmd, '--help']).done;
      assert.match(r.stdout, /--no-fsync/, `${cmd} --help`);
    }
  });
});

const noSshd = sshdUnavailable();

describe('--no-fsync over ssh', { skip: straceMissing() || noSshd || false }, () => {
  let sshd: Sshd;
  before(async () => {
    sshd = await startSshd();
  });
  after(async () => {
    await sshd?.stop();
  });

  it('push: the remote receiver gets --no-fsync (and without it, fsyncs)', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'one.bin');
    fs.writeFileSync(src, seeded(5 * MiB, 9));
    for (const noFsync of [false, true]) {
      const dst = path.join(dir, noFsync ? 'pushed-nofsync.bin' : 'pushed.bin');
      const log = path.join(dir, `remote-${noFsync}.strace`);
      const remoteCmd = `strace -f -y -qq -e trace=${TRACED} -o ${log} env FFSYNC_STATE_DIR=${path.join(dir, 'remote-state')} ${process.execPath} ${CLI}`;
      const r = await run(['sync', '--json', '--state-dir', path.join(dir, 'state'), '-e', sshd.rsh, '--remote-cmd', remoteCmd, ...(noFsync ? ['--no-fsync'] : []), src, `127.0.0.1:${dst}`]).done;
      assertOk(r, 'push');
      assert.equal(sha256(dst), sha256(src));
      const { rename, flush } = commitOrder(calls(log), dst);
      if (noFsync) assert.equal(flush, -1, 'the remote receiver did not fsync');
      else assert.ok(flush >= 0 && flush < rename, 'the remote receiver fsynced before the rename');
    }
  });
});
