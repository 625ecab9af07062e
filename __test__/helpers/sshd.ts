// A throwaway OpenSSH server on a loopback port for the `sync` tests: its own host key,
// client key, authorized_keys and config in a temp dir; the machine's SSH setup is never
// touched. `.ci/run` installs Debian's openssh-server; without sshd the tests skip.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export const SSHD = '/usr/sbin/sshd';

export interface Sshd {
  port: number;
  /** `-e` value for `ffsync-native sync` (and for plain ssh). */
  rsh: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** Why sshd cannot be started here, or '' if it can. */
export function sshdUnavailable(): string {
  if (process.platform !== 'linux') return 'needs Linux';
  if (!fs.existsSync(SSHD)) return `${SSHD} not installed (apt-get install openssh-server)`;
  if (spawnSync('ssh', ['-V']).status !== 0) return 'no ssh client';
  if (process.getuid?.() !== 0) return 'needs root (sshd privilege separation)';
  return '';
}

export async function startSshd(): Promise<Sshd> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-sshd-'));
  fs.chmodSync(dir, 0o700);
  const hostKey = path.join(dir, 'host_ed25519');
  const clientKey = path.join(dir, 'client_ed25519');
  for (const k of [hostKey, clientKey]) {
    const r = spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'ffsync-test', '-f', k]);
    if (r.status !== 0) throw new Error(`ssh-keygen failed: ${r.stderr}`);
  }
  const authorized = path.join(dir, 'authorized_keys');
  fs.copyFileSync(`${clientKey}.pub`, authorized);
  fs.chmodSync(authorized, 0o600);
  const port = await freePort();
  const config = path.join(dir, 'sshd_config');
  fs.writeFileSync(
    config,
    [
      `Port ${port}`,
      'ListenAddress 127.0.0.1',
      `HostKey ${hostKey}`,
      `AuthorizedKeysFile ${authorized}`,
      `PidFile ${path.join(dir, 'sshd.pid')}`,
      'UsePAM no',
      'StrictModes no',
      'PermitRootLogin yes',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'UseDNS no',
      'PrintMotd no',
      'LogLevel ERROR',
      // The remote command finds node and the CLI through the same PATH as the tests.
      `SetEnv PATH=${process.env.PATH}`,
      '',
    ].join('\n'),
  );
  let createdPrivsep = false;
  if (!fs.existsSync('/run/sshd')) {
    fs.mkdirSync('/run/sshd', { mode: 0o755 });
    createdPrivsep = true;
  }
  const proc: ChildProcess = spawn(SSHD, ['-D', '-e', '-f', config], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (d) => (err += d));
  const rsh = `ssh -p ${port} -i ${clientKey} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR`;
  const stop = async () => {
    proc.kill();
    await new Promise((r) => (proc.exitCode !== null ? r(undefined) : proc.once('exit', r)));
    if (createdPrivsep) fs.rmSync('/run/sshd', { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
  };
  for (let i = 0; i < 50; i++) {
    const r = spawnSync('ssh', [...rsh.split(' ').slice(1), '127.0.0.1', 'true'], { timeout: 10_000 });
    if (r.status === 0) return { port, rsh, stop };
    if (proc.exitCode !== null) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  await stop();
  throw new Error(`sshd did not come up: ${err}`);
}
