// The stand-ins the CLI's bundle gets for built-ins it may never use (ts/cli/lazy-builtins.ts,
// decisions §100): nothing loads until a use, every use acts on the real module, and the interop
// helpers' `__esModule` question loads nothing.
import assert from 'node:assert/strict';
import childProcess from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { describe, it } from 'node:test';
import { lazyRequire, standIn } from '../ts/cli/lazy-builtins';

describe('lazy built-ins', () => {
  it('a stand-in loads its module at the first use, once, and acts on it', () => {
    let loads = 0;
    const real = { spawn: (x: number) => x + 1, value: 7, nested: { a: 1 } };
    const s = standIn(() => (loads++, real)) as typeof real & { __esModule?: boolean };
    assert.equal(s.__esModule, undefined, '__esModule answered without loading');
    assert.equal(loads, 0);
    assert.equal(s.spawn(1), 2);
    assert.equal(loads, 1);
    assert.equal(s.value, 7);
    assert.ok('nested' in s && !('missing' in s));
    assert.deepEqual(Object.keys(s).sort(), ['nested', 'spawn', 'value']);
    assert.deepEqual({ ...s }, real, 'spread sees the real properties');
    s.value = 8;
    assert.equal(real.value, 8, 'a write reaches the module');
    assert.equal(loads, 1, 'loaded once');
  });

  it('require through it: child_process is a stand-in until used, other modules are the real ones, properties kept', () => {
    const real = createRequire(__filename);
    const req = lazyRequire(real);
    assert.equal(req('node:path'), path);
    assert.equal(req.resolve, real.resolve);
    const cp = req('node:child_process') as typeof import('node:child_process');
    assert.notEqual(cp, childProcess, 'a stand-in');
    assert.equal(req('node:child_process'), cp, 'the same stand-in for every require');
    assert.equal(cp.spawnSync, childProcess.spawnSync);
    const r = cp.spawnSync(process.execPath, ['-e', 'process.stdout.write("ok")'], { encoding: 'utf8' });
    assert.equal(r.stdout, 'ok');
  });
});
