// The child-process runner the tests and the benchmarks share (helpers/process.ts): what every
// test that runs the CLI relies on, checked against small scripted children.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { describe, test } from 'node:test';
import { ChildRun, parseJson, procCpuMs, procStatusKiB } from './helpers/process';

/** A node child running `script`. */
const node = (script: string, opts: ConstructorParameters<typeof ChildRun>[2] = {}) => new ChildRun('child', [process.execPath, '-e', script], opts);

describe('ChildRun, the shared process runner', () => {
  test('stdout arrives as lines and JSON events, including a last line without a newline', async () => {
    const p = node(`process.stdout.write('plain\\n{"event":"a","n":1}\\n[1]\\n{"event":"b"}')`);
    const exit = await p.exited;
    assert.equal(exit.code, 0);
    assert.deepEqual(p.lines, ['plain', '{"event":"a","n":1}', '[1]', '{"event":"b"}']);
    assert.deepEqual(p.events, [{ event: 'a', n: 1 }, { event: 'b' }]);
    assert.equal(p.stdout, 'plain\n{"event":"a","n":1}\n[1]\n{"event":"b"}');
  });

  test('a character split between two reads is decoded whole', async () => {
    // 'é' is two bytes in UTF-8: write the first, pause, then the second.
    const p = node(`const b = Buffer.from('é\\n'); process.stdout.write(b.subarray(0, 1)); setTimeout(() => process.stdout.write(b.subarray(1)), 100)`);
    await p.exited;
    assert.deepEqual(p.lines, ['é']);
  });

  test('waitForEvent resolves to the very object in events, for an event still to come', async () => {
    const p = node(`console.log(JSON.stringify({ event: 'early' })); setTimeout(() => console.log(JSON.stringify({ event: 'late', k: 2 })), 150)`);
    const late = await p.waitForEvent((e) => e.event === 'late');
    assert.equal(p.events.indexOf(late), 1, 'a predicate that looks the event up in events must find it');
    const early = await p.waitForEvent((e) => e.event === 'early');
    assert.equal(p.events.indexOf(early), 0);
    await p.exited;
  });

  test('waiting for output that never comes rejects with the exit and the tail of stderr', async () => {
    const p = node(`console.error('why it stopped'); process.exit(3)`);
    await assert.rejects(p.waitForLine((l) => l === 'never'), /exited \(exit code 3\) before the expected output; stderr: why it stopped/);
    const q = node(`setTimeout(() => {}, 5000)`);
    await assert.rejects(q.waitForLine(() => true, 100), /no expected output within 100 ms/);
    q.kill();
    assert.equal((await q.exited).signal, 'SIGKILL');
  });

  test('listeningPort reads the listening event', async () => {
    const p = node(`console.log(JSON.stringify({ event: 'listening', host: '127.0.0.1', port: 4321 }))`);
    assert.equal(await p.listeningPort(), 4321);
    await p.exited;
  });

  test('a detached child is killed with its process group: what it started goes too', async () => {
    // The child starts a grandchild that would outlive it, and prints its pid.
    const p = node(`const c = require('node:child_process').spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], { stdio: 'ignore' }); console.log(c.pid); setTimeout(() => {}, 60000)`, { detached: true });
    const grandchild = Number(await p.waitForLine((l) => /^\d+$/.test(l)));
    // Running, not a zombie waiting for whoever inherited it to reap it.
    const alive = (pid: number) => {
      try {
        return fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]![0] !== 'Z';
      } catch {
        return false;
      }
    };
    assert.ok(alive(grandchild));
    p.kill();
    await p.exited;
    for (let i = 0; i < 50 && alive(grandchild); i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(alive(grandchild), false, 'the grandchild was killed with the group');
  });

  test('sampling reads peak memory and CPU time from /proc while the child runs', async () => {
    // About 64 MiB touched and some CPU burned, then a pause for the sampler.
    const p = node(`const b = Buffer.alloc(64 << 20, 1); let x = 0; const t = Date.now(); while (Date.now() - t < 300) x += b[x % b.length]; setTimeout(() => {}, 200)`, { sampleMs: 20 });
    const exit = await p.exited;
    assert.equal(exit.code, 0);
    assert.ok(p.peakKiB > 64 * 1024, `VmHWM ${p.peakKiB} KiB covers the 64 MiB buffer`);
    assert.ok(p.cpuMs >= 100, `CPU ${p.cpuMs} ms covers the 300 ms busy loop`);
    assert.ok(exit.ms >= 300);
  });

  test('the /proc readers and the JSON line parser', () => {
    assert.ok(procStatusKiB(process.pid, 'VmRSS') > 0);
    assert.ok(procCpuMs(process.pid) >= 0);
    assert.equal(procStatusKiB(2 ** 22 + 1, 'VmRSS'), 0, 'a process that is gone reads as 0');
    assert.ok(Number.isNaN(procCpuMs(2 ** 22 + 1)));
    assert.deepEqual(parseJson('  {"a":1} '), { a: 1 });
    assert.equal(parseJson('{not json'), undefined);
    assert.equal(parseJson('42'), undefined);
  });
});
