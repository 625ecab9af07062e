// Deciding whether to talk to a peer, given the fingerprint of the certificate it
// presented in the TLS handshake. Order: --trust names it exactly (and pins it); it is
// pinned; on a TTY the user says yes; otherwise refuse (exit 5, nothing written).
import readline from 'node:readline';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { parseFingerprint } from './fingerprint.js';
import { addPin, isPinned } from './pins.js';
import { stateDirOption } from '../utils/state-dir.js';

export interface TrustOptions {
  stateDir: string;
  /** `--trust <fp>`: the only fingerprint acceptable for this session; pinned on success. */
  trust?: string;
  /** Vouched for by an authenticated channel (ssh): must match exactly; never pinned. */
  expect?: string;
  /** Ask on the terminal when the peer is unknown (only when stdin and stderr are TTYs). */
  interactive?: boolean;
  /** Where the peer connected from / to, for messages and the pin note. */
  peerLabel: string;
}

export async function verifyPeer(fingerprint: string, o: TrustOptions): Promise<void> {
  if (o.expect) {
    if (o.expect === fingerprint) return;
    throw new FfsyncError(
      'EFINGERPRINT',
      ExitCode.UNTRUSTED,
      `FINGERPRINT MISMATCH for ${o.peerLabel}: the ssh channel announced ${o.expect} but the QUIC peer presented ${fingerprint}; refusing`,
    );
  }
  if (o.trust) {
    const expected = parseFingerprint(o.trust);
    if (expected !== fingerprint) {
      throw new FfsyncError(
        'EFINGERPRINT',
        ExitCode.UNTRUSTED,
        `FINGERPRINT MISMATCH for ${o.peerLabel}: --trust expects ${expected} but the peer presented ${fingerprint}; refusing (someone may be impersonating the peer, or it rotated its identity)`,
      );
    }
    addPin(o.stateDir, fingerprint, o.peerLabel);
    return;
  }
  if (isPinned(o.stateDir, fingerprint)) return;
  if (o.interactive && process.stdin.isTTY && process.stderr.isTTY) {
    // The reporter has just printed the peer's fingerprint (events.peer); ask right below it.
    const rl = readline.createInterface({ input: process.stdin, output: process.stderr });
    const answer = await new Promise<string>((resolve) => rl.question('trust this peer? [y/N] ', resolve));
    rl.close();
    if (/^y(es)?$/i.test(answer.trim())) {
      addPin(o.stateDir, fingerprint, o.peerLabel);
      return;
    }
    throw new FfsyncError('EUNTRUSTED', ExitCode.UNTRUSTED, `not trusting ${o.peerLabel} (${fingerprint})`);
  }
  throw new FfsyncError(
    'EUNTRUSTED',
    ExitCode.UNTRUSTED,
    `unknown peer ${o.peerLabel} with fingerprint ${fingerprint}; if that is right, run 'ffsync-native trust ${fingerprint}${stateDirOption(o.stateDir)}' or pass --trust ${fingerprint}`,
  );
}
