// The `id`, `trust`, `untrust` and `fingerprints` commands as library calls, so a program can
// set up two peers (or a CI runner and its receiver) without shelling out. Each takes the
// state directory the peers use (`stateDir`, default as the CLI's: $FFSYNC_STATE_DIR or the
// per-user one).
import { parseFingerprint } from '../security/fingerprint.js';
import { loadOrCreateIdentity } from '../security/identity.js';
import { addPin, type Pin, readPins, removePin } from '../security/pins.js';
import { resolveStateDir } from '../utils/state-dir.js';

export interface StateOptions {
  stateDir?: string;
}

/** This peer's certificate fingerprint (creating its identity on first use), as `ffsync-native id`. */
export function id(o: StateOptions & { rotate?: boolean } = {}): string {
  return loadOrCreateIdentity(resolveStateDir(o.stateDir), { rotate: o.rotate }).fingerprint;
}

/** Pin a peer's fingerprint, as `ffsync-native trust`; false if it was already pinned. Throws an
 * `FfsyncError` (exit 1) for a malformed fingerprint. */
export function trust(fingerprint: string, o: StateOptions & { note?: string } = {}): boolean {
  return addPin(resolveStateDir(o.stateDir), parseFingerprint(fingerprint), o.note ?? '');
}

/** Remove a pin, as `ffsync-native untrust`; false if it was not pinned. */
export function untrust(fingerprint: string, o: StateOptions = {}): boolean {
  return removePin(resolveStateDir(o.stateDir), parseFingerprint(fingerprint));
}

/** The pinned fingerprints, as `ffsync-native fingerprints`. */
export function fingerprints(o: StateOptions = {}): Pin[] {
  return readPins(resolveStateDir(o.stateDir));
}
