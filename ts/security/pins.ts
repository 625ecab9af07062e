// Pinned peers: <state>/pins.conf, one fingerprint per line, optionally followed by a
// note; '#' starts a comment. Written atomically.
import fs from 'node:fs';
import path from 'node:path';
import { parseFingerprint } from './fingerprint.js';
import { forgetHello } from '../utils/remembered-hello.js';

export interface Pin {
  fingerprint: string;
  note: string;
}

export function pinsPath(stateDir: string): string {
  return path.join(stateDir, 'pins.conf');
}

export function readPins(stateDir: string): Pin[] {
  let text: string;
  try {
    text = fs.readFileSync(pinsPath(stateDir), 'utf8');
  } catch {
    return [];
  }
  const pins: Pin[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.replace(/#.*/, '').trim();
    if (!line) continue;
    const [fp, ...note] = line.split(/\s+/);
    try {
      pins.push({ fingerprint: parseFingerprint(fp), note: note.join(' ') });
    } catch {
      // A malformed line pins nothing (and is kept as-is on rewrite only if valid).
    }
  }
  return pins;
}

function writePins(stateDir: string, pins: Pin[]): void {
  fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const body = '# ffsync-native pinned peers: <fingerprint> [note]\n' + pins.map((p) => `${p.fingerprint}${p.note ? ' ' + p.note : ''}\n`).join('');
  const tmp = `${pinsPath(stateDir)}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, body, { mode: 0o600 });
  fs.renameSync(tmp, pinsPath(stateDir));
}

export function isPinned(stateDir: string, fingerprint: string): boolean {
  return readPins(stateDir).some((p) => p.fingerprint === fingerprint);
}

/** Returns false if it was already pinned. */
export function addPin(stateDir: string, fingerprint: string, note = ''): boolean {
  const pins = readPins(stateDir);
  if (pins.some((p) => p.fingerprint === fingerprint)) return false;
  writePins(stateDir, [...pins, { fingerprint, note }]);
  return true;
}

/** Returns false if it was not pinned. */
export function removePin(stateDir: string, fingerprint: string): boolean {
  const pins = readPins(stateDir);
  const rest = pins.filter((p) => p.fingerprint !== fingerprint);
  if (rest.length === pins.length) return false;
  writePins(stateDir, rest);
  forgetHello(stateDir, fingerprint); // what it said is no longer of a peer we know
  return true;
}
