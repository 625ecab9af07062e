// `ffsync-native completion bash|zsh|fish` (issue 19): scripts generated from the CLI's own
// definitions. bash is exercised for real (the completion function run on typed words); zsh and
// fish are parsed by their shells where installed, and checked for every command and option.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { run, tmpdir } from './helpers/peers';
import { buildProgram } from '../ts/cli/program';

const commands = buildProgram()
  .commands.filter((c) => !(c as unknown as { _hidden?: boolean })._hidden)
  .map((c) => c.name());

/** COMPREPLY of the bash completion function for the words typed so far (the last one is being completed). */
function bashComplete(script: string, words: string[], cwd: string): string[] {
  const file = path.join(cwd, 'ffsync.bash');
  fs.writeFileSync(file, script);
  const quoted = words.map((w) => `'${w}'`).join(' ');
  const r = spawnSync('bash', ['-c', `source ${file}; COMP_WORDS=(${quoted}); COMP_CWORD=${words.length - 1}; _ffsync_native; printf '%s\\n' "\${COMPREPLY[@]}"`], { cwd, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.split('\n').filter(Boolean);
}

it('bash: commands, then each command’s own options, then paths', async () => {
  const dir = tmpdir();
  const r = await run(['completion', 'bash']).done;
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(bashComplete(r.stdout, ['ffsync-native', 's'], dir).sort(), ['send', 'serve', 'sync']);
  assert.deepEqual(bashComplete(r.stdout, ['ffsync-native', 'sync', '--del'], dir).sort(), ['--delete', '--delete-after', '--delete-before', '--delete-delay', '--delete-during', '--delete-excluded']);
  assert.ok(!bashComplete(r.stdout, ['ffsync-native', 'sync', '-'], dir).includes('--hard-links'), 'options refused as not supported are not offered');
  assert.ok(bashComplete(r.stdout, ['ffsync-native', 'sync', '-'], dir).includes('--human-readable'));
  assert.deepEqual(bashComplete(r.stdout, ['ffsync-native', 'send', '--del'], dir), [], 'send has no --delete (it has --no-delete)');
  assert.ok(!bashComplete(r.stdout, ['ffsync-native', ''], dir).includes('server'), 'the hidden ssh end is not offered');
  fs.writeFileSync(path.join(dir, 'release.tar'), '');
  assert.deepEqual(bashComplete(r.stdout, ['ffsync-native', 'send', 'rel'], dir), ['release.tar']);
});

for (const shell of ['zsh', 'fish'] as const) {
  it(`${shell}: every command and option is in the script`, async () => {
    const r = await run(['completion', shell]).done;
    assert.equal(r.code, 0, r.stderr);
    for (const c of commands) assert.match(r.stdout, new RegExp(shell === 'zsh' ? `'${c}:` : `-a ${c} `), `${shell} offers ${c}`);
    assert.match(r.stdout, shell === 'zsh' ? /'--delete\[/ : /-l delete /);
    assert.doesNotMatch(r.stdout, /\bserver\b/);
  });

  const installed = spawnSync(shell, ['--version']).status === 0;
  it(`${shell} parses its script`, { skip: !installed && `${shell} is not installed` }, async () => {
    const r = await run(['completion', shell]).done;
    const file = path.join(tmpdir(), `completion.${shell}`);
    fs.writeFileSync(file, r.stdout);
    const parse = spawnSync(shell, ['-n', file], { encoding: 'utf8' });
    assert.equal(parse.status, 0, `${shell} -n: ${parse.stderr}`);
  });
}

it('an unknown shell is a usage error', async () => {
  const r = await run(['completion', 'tcsh']).done;
  assert.equal(r.code, 1);
  assert.match(r.stderr, /^ffsync-native: error: .*'tcsh' is invalid.*bash, zsh, fish/m);
});
