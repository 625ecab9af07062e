// rsync's reading of a `sync` argument (ts/utils/location.ts): host or local, and "the contents of"
// (a trailing slash, or a last component of `.` or `..`: a target named `..` would be DEST's parent).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { earlyTreeTarget, syncTarget } from '../ts/api/sync';
import { isOneComponent, parseLocation } from '../ts/utils/location';
import { hashTree } from './helpers/data';
import { run, tmpdir } from './helpers/peers';

it('parseLocation: hosts, drive letters, trailing slashes and dot components', () => {
  assert.deepEqual(parseLocation('host:dir/', 'linux'), { host: 'host', path: 'dir/', slash: true });
  assert.deepEqual(parseLocation('user@host:', 'linux'), { host: 'user@host', path: '.', slash: true });
  assert.deepEqual(parseLocation('host:a/..', 'linux'), { host: 'host', path: 'a/..', slash: true });
  assert.deepEqual(parseLocation('host:a/..x', 'linux'), { host: 'host', path: 'a/..x', slash: false });
  assert.deepEqual(parseLocation('./a:b', 'linux'), { path: './a:b', slash: false });
  assert.deepEqual(parseLocation('C:/x/', 'linux'), { host: 'C', path: '/x/', slash: true });
  assert.deepEqual(parseLocation('C:\\x\\..', 'win32'), { path: 'C:\\x\\..', slash: true });
  assert.deepEqual(parseLocation('C:\\x', 'win32'), { path: 'C:\\x', slash: false });
  assert.deepEqual(parseLocation('x\\..', 'linux'), { path: 'x\\..', slash: false }, "a backslash is a name's byte on POSIX");
  for (const p of ['.', '..', 'a/.', 'a/..', '../..', '/']) assert.equal(parseLocation(p, 'linux').slash, true, p);
  for (const p of ['a', 'a/b', '...', 'a/.b', '.hidden']) assert.equal(parseLocation(p, 'linux').slash, false, p);
  assert.equal(isOneComponent('a\\b', 'linux'), true, 'a backslash is part of a POSIX name');
  assert.equal(isOneComponent('a\\b', 'win32'), false);
  assert.equal(isOneComponent('a/b', 'linux'), false);
});

it('sync -a --delete SRC/sub/.. DEST puts SRC\'s contents in DEST, as rsync does, and touches nothing beside DEST', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  fs.mkdirSync(path.join(src, 'sub'), { recursive: true });
  fs.writeFileSync(path.join(src, 'f'), 'f\n');
  fs.writeFileSync(path.join(src, 'sub', 'x'), 'x\n');
  fs.mkdirSync(path.join(dir, 'other'));
  fs.writeFileSync(path.join(dir, 'other', 'keep'), 'keep\n');
  const dst = path.join(dir, 'dst');
  // The build before took `..` as the tree's name: the target was DEST/.., this directory, whose
  // other entries --delete removed.
  const r = await run(['sync', '-a', '--delete', `${src}/sub/..`, dst, '--state-dir', path.join(dst, '..', 'other', 'state')]).done;
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(hashTree(dst), hashTree(src));
  assert.equal(fs.readFileSync(path.join(dir, 'other', 'keep'), 'utf8'), 'keep\n');
  assert.deepEqual(fs.readdirSync(dir).sort(), ['dst', 'other', 'src']);
  // `.` likewise (the same target as before, now named as rsync names it).
  const dot = path.join(dir, 'dot');
  assert.equal((await run(['sync', '-a', `${src}/.`, dot, '--state-dir', path.join(dir, 'other', 'state')]).done).code, 0);
  assert.deepEqual(hashTree(dot), hashTree(src));
});

it("a peer's SRC name is one component, and `.` / `..` as a name mean DEST itself (a server's arguments come from the peer)", async () => {
  const dir = tmpdir();
  const dest = path.join(dir, 'dest');
  fs.mkdirSync(dest);
  for (const name of ['..', '.', '']) {
    assert.equal(await syncTarget(dest, false, name, 'tree', false), dest, `name ${JSON.stringify(name)}`);
    assert.equal(await earlyTreeTarget({ path: dest, name, srcSlash: false }), dest, `early target for ${JSON.stringify(name)}`);
    await assert.rejects(syncTarget(dest, false, name || '.', 'file', false), /cannot be named/);
  }
  await assert.rejects(syncTarget(dest, false, '../escape', 'tree', false), /not one path component/);
  assert.equal(await earlyTreeTarget({ path: dest, name: '../escape', srcSlash: false }), undefined);
  assert.equal(await syncTarget(dest, false, 'tree', 'tree', false), path.join(dest, 'tree'));
  assert.deepEqual(fs.readdirSync(dir), ['dest'], 'nothing made beside DEST');
});
