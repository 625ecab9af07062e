// README's "Get started" runs as written (issue 19: every block meant to run is executed by a
// test). The only substitutions are the ones a reader makes: `npx ffsync-native` is this
// build, port 7788 becomes a free one, and the address and code are the ones the receiver
// actually printed. Each side has its own state directory, as two machines would.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, tmpdir } from './helpers/peers';

const README = fs.readFileSync(path.join(__dirname, '..', 'README.md'), 'utf8');

/** The ```sh blocks of a README section, in order. */
function blocks(heading: string): string[] {
  const at = README.indexOf(`\n${heading}\n`);
  assert.ok(at >= 0, `README has "${heading}"`);
  const section = README.slice(at + heading.length + 2).split(/\n## /)[0]!;
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

/** `npx ffsync-native …` as argv for this build. */
function argv(line: string): string[] {
  const m = /^npx ffsync-native (.*)$/.exec(line.trim());
  assert.ok(m, `a command line: ${line}`);
  return m[1]!.split(/\s+/);
}

describe("README's Get started", () => {
  const [help, firstContact] = blocks('## Get started');

  it('the help command runs', () => {
    const r = spawnSync(process.execPath, [CLI, ...argv(help!.trim())], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /receive/);
    assert.match(r.stdout, /send/);
    assert.match(r.stdout, /sync/);
  });

  it('first contact: the receiver prints what the README shows, the printed line pairs and sends, and the later runs need nothing', async () => {
    const lines = firstContact!.split('\n');
    const commands = lines.filter((l) => l.startsWith('npx '));
    const shown = lines.filter((l) => l.startsWith('# ') && !/^# on the /.test(l)).map((l) => l.slice(2));
    assert.equal(commands.length, 2, firstContact);
    const [receiveLine, sendLine] = commands as [string, string];
    const dir = tmpdir('ffsync-readme-');
    const machines = { receiver: path.join(dir, 'receiving-machine'), sender: path.join(dir, 'sending-machine') };
    for (const m of Object.values(machines)) fs.mkdirSync(m);
    fs.mkdirSync(path.join(machines.sender, 'dist', 'bin'), { recursive: true });
    fs.writeFileSync(path.join(machines.sender, 'dist', 'app.js'), 'console.log("1.4.2")\n');
    fs.writeFileSync(path.join(machines.sender, 'dist', 'bin', 'tool'), Buffer.alloc(300_000, 3));
    const env = (m: string) => ({ ...process.env, FFSYNC_STATE_DIR: path.join(m, '.state'), CI: '1' });

    const receiveArgs = argv(receiveLine).map((a) => (a === '7788' ? '0' : a));
    const runReceiver = () => {
      const child = spawn(process.execPath, [CLI, ...receiveArgs], { cwd: machines.receiver, env: env(machines.receiver), stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.on('data', (d: Buffer) => (out += d));
      child.stderr.on('data', (d: Buffer) => (err += d));
      const done = new Promise<number | null>((resolve) => child.on('close', resolve));
      const until = async (re: RegExp) => {
        for (let i = 0; i < 200 && !re.test(out); i++) await new Promise((r) => setTimeout(r, 50));
        assert.match(out, re, `receiver printed:\n${out}\n${err}`);
        return out;
      };
      return { done, until, output: () => out + err };
    };

    const first = runReceiver();
    const printed = (await first.until(/--pair \S+\n/)).split('\n').filter(Boolean);
    // The same three lines as the README, up to the address, port and code.
    assert.equal(printed.length, shown.length, printed.join('\n'));
    const pattern = (l: string) => new RegExp(`^${l.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace('0\\.0\\.0\\.0', '[\\d.]+').replace(/7788/g, '\\d+').replace(/7-amber-orbit/g, '\\d+-[a-z]+-[a-z]+').replace('10\\.0\\.0\\.5', '[\\d.]+')}$`);
    shown.forEach((l, i) => assert.match(printed[i]!, pattern(l)));
    const [, addr, code] = /^\s*ffsync-native send \S+ (\S+) --pair (\S+)$/.exec(printed[2]!)!;
    // The sender runs the README's line with what its receiver printed.
    const sendArgs = argv(sendLine.replace('10.0.0.5:7788', addr!).replace('7-amber-orbit', code!));
    const s = spawnSync(process.execPath, [CLI, ...sendArgs], { cwd: machines.sender, env: env(machines.sender), encoding: 'utf8' });
    assert.equal(s.status, 0, `${s.stderr}\nreceiver:\n${first.output()}`);
    assert.equal(await first.done, 0, first.output());
    const got = path.join(machines.receiver, 'releases');
    assert.equal(fs.readFileSync(path.join(got, 'app.js'), 'utf8'), 'console.log("1.4.2")\n');
    assert.equal(fs.statSync(path.join(got, 'bin', 'tool')).size, 300_000);

    // "Later runs are `receive ./releases 7788` and `send ./dist 10.0.0.5:7788`: no code, no flags."
    const later = /Later runs are `(receive [^`]+)` and `(send [^`]+)`/.exec(README);
    assert.ok(later, 'README names the later runs');
    fs.writeFileSync(path.join(machines.sender, 'dist', 'app.js'), 'console.log("1.4.3")\n');
    const again = runReceiver();
    const port = /listening on \S+:(\d+)/.exec(await again.until(/listening on \S+:\d+\n/))![1];
    assert.doesNotMatch(again.output(), /pairing code/);
    const host = addr!.replace(/:\d+$/, '');
    const s2 = spawnSync(process.execPath, [CLI, ...later[2]!.replace('10.0.0.5:7788', `${host}:${port}`).split(/\s+/)], { cwd: machines.sender, env: env(machines.sender), encoding: 'utf8' });
    assert.equal(s2.status, 0, s2.stderr);
    assert.equal(await again.done, 0, again.output());
    assert.equal(fs.readFileSync(path.join(got, 'app.js'), 'utf8'), 'console.log("1.4.3")\n');
  });
});
