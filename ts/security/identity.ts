// This peer's TLS identity, created on first use in the state directory:
//   <state>/identity/cert.pem   (public)
//   <state>/identity/key.pem    (private, mode 0600, directory 0700)
// The certificate is generated natively with rcgen (crates/ffsync_core/src/identity.rs).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { generateIdentity } from '../native/binding.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { fingerprintOfPem } from './fingerprint.js';

export interface Identity {
  certPem: string;
  keyPem: string;
  fingerprint: string;
}

export function identityPaths(stateDir: string): { dir: string; cert: string; key: string } {
  const dir = path.join(stateDir, 'identity');
  return { dir, cert: path.join(dir, 'cert.pem'), key: path.join(dir, 'key.pem') };
}

export function loadOrCreateIdentity(stateDir: string, opts: { rotate?: boolean } = {}): Identity {
  const p = identityPaths(stateDir);
  if (!opts.rotate && fs.existsSync(p.cert) && fs.existsSync(p.key)) {
    const certPem = fs.readFileSync(p.cert, 'utf8');
    const keyPem = fs.readFileSync(p.key, 'utf8');
    if (process.platform !== 'win32' && (fs.statSync(p.key).mode & 0o077) !== 0) {
      throw new FfsyncError('EKEYPERM', ExitCode.FILE_IO, `${p.key} is readable by other users; run 'chmod 600 ${p.key}'`);
    }
    return { certPem, keyPem, fingerprint: fingerprintOfPem(certPem) };
  }
  fs.mkdirSync(p.dir, { recursive: true, mode: 0o700 });
  const id = generateIdentity(`ffsync-native ${os.hostname()}`);
  // Write both files to temporaries, then rename: a crash never leaves half an identity.
  const tmpKey = `${p.key}.${process.pid}.tmp`;
  const tmpCert = `${p.cert}.${process.pid}.tmp`;
  fs.writeFileSync(tmpKey, id.keyPem, { mode: 0o600, flag: 'wx' });
  fs.writeFileSync(tmpCert, id.certPem, { mode: 0o644, flag: 'wx' });
  fs.renameSync(tmpKey, p.key);
  fs.renameSync(tmpCert, p.cert);
  return { certPem: id.certPem, keyPem: id.keyPem, fingerprint: fingerprintOfPem(id.certPem) };
}
