// The remote end of `sync` over ssh is told its options on its command line (docs/protocol.md
// §10); one table writes and reads them (ts/api/server-args.ts). Every option survives the
// round trip, what is unset stays unset, and a malformed command line is a usage error.
import assert from 'node:assert/strict';
import { it } from 'node:test';
import { parseServerArgs, type ServerArgs, serverArgs } from '../ts/api/server-args';
import { FfsyncError } from '../ts/utils/errors';
import type { DirMergeSpec } from '../ts/native/binding';

it('every option survives the round trip through the remote command line', () => {
  const full: ServerArgs = {
    role: 'receiver',
    path: '/srv/a b',
    name: 'dist',
    srcSlash: true,
    destSlash: true,
    checksum: true,
    dryRun: true,
    update: true,
    wholeFile: true,
    oneFileSystem: true,
    compressLevel: 0,
    bwlimitKiBps: 512,
    excludes: ['*.log', '--looks-like-a-flag'],
    filesFrom: ['a', 'b/c'],
    filesFromRecursive: true,
    rules: { wire: ['- x'], dirMerge: [{ name: '.rsync-filter', inherit: true, wordSplit: false } as DirMergeSpec] },
    quic: true,
    inplace: true,
    fsync: false,
    jobs: 4,
    maxSize: 1 << 20,
    minSize: 0,
    attrs: 15,
    omit: { links: true, perms: true },
    choices: { ignoreExisting: true },
    mkpath: true,
    deleteExcluded: true,
    chmod: 'Du=rwx,Fgo=r',
    pruneEmptyDirs: true,
    removeSourceFiles: true,
    copyLinks: true,
    chown: 'www:web',
    maxDelete: 0,
    backup: true,
    suffix: '.bak',
    backupDir: '../old',
    partialDir: '.rsync-partial',
    stateDir: '/var/lib/ffsync',
  };
  assert.deepEqual(parseServerArgs(serverArgs(full)), full);
  const bare: ServerArgs = { role: 'sender', path: 'src/' };
  assert.deepEqual(serverArgs(bare), ['--sender', 'src/']);
  assert.deepEqual(parseServerArgs(serverArgs(bare)), bare);
  assert.deepEqual(serverArgs({ ...bare, fsync: true, backup: false, checksum: false }), ['--sender', 'src/'], 'defaults are not written');
});

it('reads the long spellings and --flag=value too, as older builds and people write them', () => {
  assert.deepEqual(parseServerArgs(['--receiver', 'd', '--checksum', '--dry-run', '--compress-level=3', '--exclude=a', '--exclude', 'b', '--omit', 'times,bogus']), {
    role: 'receiver',
    path: 'd',
    checksum: true,
    dryRun: true,
    compressLevel: 3,
    excludes: ['a', 'b'],
    omit: { times: true },
  });
});

it('a malformed remote command line is a usage error (exit 1) naming what is wrong', () => {
  for (const [argv, message] of [
    [['--name', 'x'], /exactly one of --sender PATH or --receiver PATH/],
    [['--sender', 'a', '--receiver', 'b'], /exactly one of/],
    [['--sender', 'a', '--frobnicate'], /unknown option --frobnicate/],
    [['--sender', 'a', '--jobs', '17'], /--jobs takes an integer from 1 to 16, not "17"/],
    [['--sender', 'a', '--max-size', '-1'], /--max-size takes an integer/],
    [['--sender', 'a', '--rules-json', '{'], /--rules-json takes JSON/],
    [['--sender', 'a', '--name'], /--name needs a value/],
  ] as const) {
    assert.throws(
      () => parseServerArgs([...argv]),
      (e: unknown) => e instanceof FfsyncError && e.exitCode === 1 && message.test(e.message),
      argv.join(' '),
    );
  }
});
