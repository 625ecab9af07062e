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
  /** The address sshd listens on (127.0.0.1 unless startSshd was told otherwise). */
  host: string;
  /** Its keys, config and pid file (removed by stop()). */
  dir: string;
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

export interface SshdOptions {
  /** Address to listen on (default 127.0.0.1). */
  listen?: string;
  /** Port (default: a free loopback port). */
  port?: number;
  /** Run sshd inside this network namespace (`ip netns exec`); bench/net.ts shapes a link into it. */
  netns?: string;
  /** The namespace the readiness probe's ssh client runs in (default: this process's). */
  clientNetns?: string;
}

const inNetns = (ns: string | undefined, argv: string[]): string[] => (ns ? ['ip', 'netns', 'exec', ns, ...argv] : argv);

export async function startSshd(opts: SshdOptions = {}): Promise<Sshd> {
  const listen = opts.listen ?? '127.0.0.1';
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
  const port = opts.port ?? (await freePort());
  const config = path.join(dir, 'sshd_config');
  fs.writeFileSync(
    config,
    [
      `Port ${port}`,
      `ListenAddress ${listen}`,
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
  const [cmd, ...args] = inNetns(opts.netns, [SSHD, '-D', '-e', '-f', config]);
  const proc: ChildProcess = spawn(cmd!, args, { stdio: ['ignore', 'ignore', 'pipe'] });
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
    const [c, ...a] = inNetns(opts.clientNetns, ['ssh', ...rsh.split(' ').slice(1), listen, 'true']);
    const r = spawnSync(c!, a, { timeout: 10_000 });
    if (r.status === 0) return { port, host: listen, dir, rsh, stop };
    if (proc.exitCode !== null) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  await stop();
  throw new Error(`sshd did not come up: ${err}`);
}
