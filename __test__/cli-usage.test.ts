// The front door's first minute (issue 19): a usage error is one `ffsync-native: error:` line
// plus at most one hint line and exit 1, on every command, never the help text; `sync -h` is
// rsync's --human-readable (it syncs, it does not print help); `--stats` prints rsync's fields
// in rsync's number format, checked against rsync itself on the same tree.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { listing, run, tmpdir } from './helpers/peers';
import { rsyncDecimal, rsyncNumber } from '../ts/utils/format';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;

/** Runs the CLI and checks a usage error's shape: exit 1, nothing on stdout, exactly two
 * stderr lines, the first the error, the second the hint. Returns the two lines. */
async function usageError(args: string[]): Promise<[string, string]> {
  const r = await run(args).done;
  assert.equal(r.code, 1, `${args.join(' ')}: exit ${r.code}\n${r.stderr}`);
  assert.equal(r.stdout, '', `${args.join(' ')}: nothing on stdout (no help text)`);
  const lines = r.stderr.trimEnd().split('\n');
  assert.equal(lines.length, 2, `${args.join(' ')}: one error line and one hint, got:\n${r.stderr}`);
  assert.match(lines[0]!, /^ffsync-native: error: /);
  return [lines[0]!, lines[1]!];
}

describe('usage errors: one line, one hint, exit 1', () => {
  it('unknown option, with commander’s suggestion when there is one, on every command', async () => {
    const dir = tmpdir();
    const [e1, h1] = await usageError(['sync', '-a', '--frobnicate', path.join(dir, 'a'), path.join(dir, 'b')]);
    assert.equal(e1, "ffsync-native: error: unknown option '--frobnicate'");
    assert.equal(h1, "see 'ffsync-native sync --help'");
    const [e2, h2] = await usageError(['sync', '--delte', path.join(dir, 'a'), path.join(dir, 'b')]);
    assert.equal(e2, "ffsync-native: error: unknown option '--delte'");
    assert.equal(h2, "did you mean --delete? (see 'ffsync-native sync --help')");
    for (const cmd of [
      ['send', path.join(dir, 'a'), '127.0.0.1:9'],
      ['receive', path.join(dir, 'a'), '0'],
      ['serve', dir, '0'],
      ['trust', 'AB'],
      ['id'],
    ]) {
      const [e, h] = await usageError([...cmd, '--no-such-flag']);
      assert.equal(e, "ffsync-native: error: unknown option '--no-such-flag'");
      assert.equal(h, `see 'ffsync-native ${cmd[0]} --help'`);
    }
  });

  it('unknown command, missing argument, bad value, too many arguments', async () => {
    const [e1, h1] = await usageError(['snyc', 'a', 'b']);
    assert.equal(e1, "ffsync-native: error: unknown command 'snyc'");
    assert.equal(h1, "did you mean sync? (see 'ffsync-native --help')");
    const [e2] = await usageError(['sync', 'a']);
    assert.equal(e2, "ffsync-native: error: missing required argument 'DEST'");
    const [e3, h3] = await usageError(['send', '/x', '127.0.0.1:9', '--timeout', 'soon']);
    assert.match(e3, /^ffsync-native: error: option '--timeout <seconds>' argument 'soon' is invalid\. expected an integer from 1 to 86400$/);
    assert.equal(h3, "see 'ffsync-native send --help'");
    const [e4] = await usageError(['sync', 'a', 'b', 'c']);
    assert.match(e4, /too many arguments for 'sync'/);
  });

  it('--help still prints the help and exits 0', async () => {
    const r = await run(['sync', '--help']).done;
    assert.equal(r.code, 0);
    assert.match(r.stdout, /Usage: ffsync-native sync/);
    assert.match(r.stdout, /-h, --human-readable/);
  });
});

describe('sync -h is --human-readable; --stats in rsync’s format', () => {
  function tree(dir: string): string {
    const src = path.join(dir, 'src');
    fs.mkdirSync(path.join(src, 'd1'), { recursive: true });
    fs.mkdirSync(path.join(src, 'd2'));
    fs.writeFileSync(path.join(src, 'a'), 'hello\n');
    fs.writeFileSync(path.join(src, 'd1', 'b'), Buffer.alloc(100_000, 7));
    fs.symlinkSync('a', path.join(src, 'l'));
    return src;
  }

  /** `Name: value` lines of a --stats output. */
  function fields(out: string): Map<string, string> {
    const m = new Map<string, string>();
    for (const line of out.split('\n')) {
      const i = line.indexOf(': ');
      if (i > 0) m.set(line.slice(0, i), line.slice(i + 2));
    }
    return m;
  }

  it('-avh syncs the tree (it is not help) and prints sizes in units', async () => {
    const dir = tmpdir();
    const src = tree(dir);
    const dest = path.join(dir, 'out');
    const r = await run(['sync', '-avh', '--stats', '--state-dir', path.join(dir, 'state'), src + '/', dest]).done;
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stdout, /Usage:/);
    assert.equal(fs.readFileSync(path.join(dest, 'd1', 'b')).length, 100_000, 'the tree was copied');
    const f = fields(r.stdout);
    assert.equal(f.get('Total transferred file size'), '100.01K bytes');
    assert.match(r.stdout, /^sent [\d.]+K bytes {2}received \d+ bytes {2}[\d.]+[KM]? bytes\/sec$/m);
    assert.match(r.stdout, /^total size is 100\.01K {2}speedup is \d+\.\d\d$/m);
  });

  it('a dry run says (DRY RUN) on the totals line and writes nothing', async () => {
    const dir = tmpdir();
    const src = tree(dir);
    const dest = path.join(dir, 'out');
    const r = await run(['sync', '-a', '-n', '--stats', '--state-dir', path.join(dir, 'state'), src + '/', dest]).done;
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^total size is [\d,]+ {2}speedup is \d+\.\d\d \(DRY RUN\)$/m);
    assert.equal(fs.existsSync(dest), false);
  });

  it('the counts match rsync --stats on the same tree, first sync and after a change', { skip: !haveRsync && 'rsync is not installed' }, async () => {
    const dir = tmpdir();
    const src = tree(dir);
    const ours = path.join(dir, 'ours');
    const theirs = path.join(dir, 'theirs');
    const compared = ['Number of files', 'Number of regular files transferred', 'Literal data'];
    for (const step of ['first', 'changed'] as const) {
      if (step === 'changed') {
        fs.appendFileSync(path.join(src, 'a'), 'x\n');
        fs.rmSync(path.join(src, 'd2'), { recursive: true });
      }
      const r = await run(['sync', '-a', '--delete', '--stats', '--state-dir', path.join(dir, 'state'), src + '/', ours]).done;
      assert.equal(r.code, 0, r.stderr);
      const rs = spawnSync('rsync', ['-a', '--delete', '--stats', src + '/', theirs], { encoding: 'utf8' });
      assert.equal(rs.status, 0, rs.stderr);
      const a = fields(r.stdout);
      const b = fields(rs.stdout);
      for (const k of compared) assert.equal(a.get(k), b.get(k), `${step}: "${k}": ours ${a.get(k)}, rsync ${b.get(k)}`);
      // Created: rsync also counts the root directory when DEST did not exist; the sender does not
      // know that, so ours leaves the root out (docs/cli.md, "Itemized changes").
      const rootMade = step === 'first' ? 1 : 0;
      const rc = /^(\d+)(?: \((.*)\))?$/.exec(b.get('Number of created files')!)!;
      const rsyncKinds = Object.fromEntries((rc[2] ?? '').split(', ').filter(Boolean).map((kv) => kv.split(': ')));
      const want = Number(rc[1]) - rootMade;
      const kinds = [
        ['reg', Number(rsyncKinds.reg ?? 0)],
        ['dir', Number(rsyncKinds.dir ?? 0) - rootMade],
        ['link', Number(rsyncKinds.link ?? 0)],
      ].filter(([, k]) => (k as number) > 0);
      assert.equal(a.get('Number of created files'), want === 0 ? '0' : `${want} (${kinds.map(([k, v]) => `${k}: ${v}`).join(', ')})`, `${step}: created`);
      // rsync breaks a non-zero deletion count down by type ("1 (dir: 1)"); ours gives the count.
      assert.equal(a.get('Number of deleted files'), b.get('Number of deleted files')!.split(' ')[0], `${step}: deletions`);
    }
  });

  it('numbers as rsync prints them: commas by default, units of 1000 with -h, of 1024 with -hh', () => {
    assert.equal(rsyncNumber(100_007, 1), '100,007');
    assert.equal(rsyncNumber(999, 1), '999');
    assert.equal(rsyncNumber(1_234_567_890, 1), '1,234,567,890');
    assert.equal(rsyncNumber(100_007, 2), '100.01K');
    assert.equal(rsyncNumber(999, 2), '999');
    assert.equal(rsyncNumber(69_189_012, 2), '69.19M');
    assert.equal(rsyncNumber(1024, 3), '1.00K');
    assert.equal(rsyncNumber(5 * 1024 ** 3, 3), '5.00G');
    assert.equal(rsyncDecimal(200_684, 1), '200,684.00');
    assert.equal(rsyncDecimal(200_684, 2), '200.68K');
    assert.equal(rsyncDecimal(12.5, 1), '12.50');
  });
});

describe('rsync flags on sync, with rsync as the oracle', () => {
  function source(dir: string): string {
    const src = path.join(dir, 'src');
    fs.mkdirSync(path.join(src, 'd1', 'deep'), { recursive: true });
    fs.mkdirSync(path.join(src, 'd2'));
    fs.writeFileSync(path.join(src, 'a'), 'a\n');
    fs.writeFileSync(path.join(src, 'keep.txt'), 'k\n');
    fs.writeFileSync(path.join(src, 'd1', 'b.log'), 'b\n');
    fs.writeFileSync(path.join(src, 'd1', 'deep', 'c.txt'), 'c\n');
    fs.symlinkSync('a', path.join(src, 'l'));
    return src;
  }

  /** Same flags, same tree, same starting target: ffsync-native sync and rsync end with the same listing. */
  async function sameAsRsync(flags: string[], prepare?: (target: string) => void, where: { from: string; to: string } = { from: 'src/', to: '' }): Promise<string[]> {
    const dir = tmpdir();
    source(dir);
    const ours = path.join(dir, 'ours');
    const theirs = path.join(dir, 'theirs');
    prepare?.(ours);
    prepare?.(theirs);
    // path.join keeps a trailing slash, and rsync reads it as we do.
    const from = path.join(dir, where.from);
    const to = (root: string) => path.join(root, where.to);
    const r = await run(['sync', ...flags, '--state-dir', path.join(dir, 'state'), from, to(ours)]).done;
    assert.equal(r.code, 0, `sync ${flags.join(' ')}: ${r.stderr}`);
    const rs = spawnSync('rsync', [...flags, from, to(theirs)], { encoding: 'utf8' });
    assert.equal(rs.status, 0, `rsync ${flags.join(' ')}: ${rs.stderr}`);
    assert.deepEqual(listing(ours), listing(theirs), `sync ${flags.join(' ')} vs rsync`);
    return listing(ours);
  }

  const skip = !haveRsync && 'rsync is not installed';

  it('the letters of -a given one by one (-rlptD, -rlpt) copy what rsync copies', { skip }, async () => {
    await sameAsRsync(['-rlptD']);
    await sameAsRsync(['-rlpt']);
  });

  it('an exclude that matches the source directory’s own name, or everything, never drops the root', { skip }, async () => {
    assert.deepEqual(await sameAsRsync(['-a', '--exclude', '*']), []);
    assert.ok((await sameAsRsync(['-a', '--exclude', 'src'])).includes('a: a\n'), 'the tree is copied');
  });

  it('--include-from keeps its patterns in the rules’ order', { skip }, async () => {
    const dir = tmpdir();
    const list = path.join(dir, 'include.txt');
    fs.writeFileSync(list, '# comment\n\nd1/\nd1/deep/\n*.txt\n');
    const got = await sameAsRsync(['-a', '--include-from', list, '--exclude', '*']);
    assert.ok(got.includes('d1/deep/c.txt: c\n') && !got.some((l) => l.startsWith('d1/b.log')), got.join('\n'));
  });

  it('--delete-after, --delete-before, --delete-during delete what only DEST has, like --delete', { skip }, async () => {
    for (const flag of ['--delete-after', '--delete-before', '--delete-during']) {
      const got = await sameAsRsync(['-a', flag], (t) => {
        fs.mkdirSync(t, { recursive: true });
        fs.writeFileSync(path.join(t, 'only-here'), 'x');
      });
      assert.ok(!got.some((l) => l.startsWith('only-here')), flag);
    }
  });

  it('--mkpath creates the missing components of DEST, for a tree\'s contents, a named tree and a file', { skip }, async () => {
    for (const [from, to] of [['src/', 'a/b/c/'], ['src', 'q/w'], ['src/a', 'x/y/z.txt']] as const) {
      const got = await sameAsRsync(['-a', '--mkpath'], undefined, { from, to });
      assert.ok(got.length > 0, `${from} -> ${to}`);
    }
  });

  it('-4 / -6 and --contimeout reach ssh (rsync passes -4 / -6 to ssh)', async () => {
    const dir = tmpdir();
    const src = source(dir);
    // A stand-in named ssh: records its arguments, then fails as an unreachable ssh would.
    const bin = path.join(dir, 'bin');
    fs.mkdirSync(bin);
    const log = path.join(dir, 'ssh-args');
    fs.writeFileSync(path.join(bin, 'ssh'), `#!/bin/sh\nprintf '%s\\n' "$@" > ${JSON.stringify(log)}\nexit 255\n`, { mode: 0o755 });
    for (const [flags, want] of [[['-4', '--contimeout', '7'], ['-4', '-o', 'ConnectTimeout=7']], [['-6'], ['-6']]] as const) {
      const r = await run(['sync', '-a', ...flags, '-e', path.join(bin, 'ssh'), '--state-dir', path.join(dir, 'state'), src + '/', 'somehost:/srv/x']).done;
      assert.equal(r.code, 255, r.stderr);
      const args = fs.readFileSync(log, 'utf8').split('\n');
      assert.deepEqual(args.slice(0, want.length), [...want], args.join(' '));
      assert.equal(args[want.length], 'somehost');
    }
  });

  it('rsync options not implemented yet are refused by name (exit 1), never ignored or called unknown', async () => {
    const dir = tmpdir();
    const src = source(dir);
    for (const opt of [['-H'], ['-A']]) {
      const r = await run(['sync', '-a', ...opt, '--state-dir', path.join(dir, 'state'), src + '/', path.join(dir, 'out')]).done;
      assert.equal(r.code, 1, `${opt.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /^ffsync-native: error: .* is not supported by this version of ffsync-native\n$/, opt.join(' '));
      assert.equal(fs.existsSync(path.join(dir, 'out')), false, `${opt.join(' ')}: nothing written`);
    }
  });
});
