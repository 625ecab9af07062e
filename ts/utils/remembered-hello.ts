// What a receiver said in its HELLO at our last session with it, kept per certificate
// fingerprint in the state directory (<state>/hellos/<fingerprint>). A sender that knows its
// receiver's versions and capabilities can send a tree's OFFER, FILTER, TREE_OPTIONS and
// manifest behind its own HELLO instead of a round trip later, once the receiver's HELLO has
// come (decisions §93, protocol.md §9.1 "Sending before the receiver's HELLO"). The sender
// checks the receiver's real HELLO before it reads anything else; a receiver that changed in a
// way that matters fails that one session (exit 2) and is remembered as it is now.
//
// Only peers known by a pinned certificate are remembered: an address (plaintext, ssh) may be
// a different receiver each time. The file is a cache: unreadable or malformed, it is ignored;
// a write that fails is not an error of the session.

import fs from 'node:fs';
import path from 'node:path';
import type { Hello } from '../protocol/messages.js';

function helloPath(stateDir: string, fingerprint: string): string {
  // Canonical fingerprints are hex groups joined by '-': safe as a file name everywhere.
  return path.join(stateDir, 'hellos', fingerprint.replace(/[^0-9A-Fa-f-]/g, ''));
}

/** The HELLO this peer sent last time, if one is remembered and well formed. */
export function rememberedHello(stateDir: string, fingerprint: string): Hello | undefined {
  let text: string;
  try {
    text = fs.readFileSync(helloPath(stateDir, fingerprint), 'utf8');
  } catch {
    return undefined;
  }
  try {
    const h = JSON.parse(text) as Record<string, unknown>;
    const int = (v: unknown, max: number) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= max;
    if (!int(h.minVersion, 0xffff) || !int(h.maxVersion, 0xffff) || !int(h.capabilities, 0xffff_ffff) || !int(h.role, 0xff) || typeof h.software !== 'string') return undefined;
    return { minVersion: h.minVersion as number, maxVersion: h.maxVersion as number, capabilities: h.capabilities as number, role: h.role as number, software: h.software };
  } catch {
    return undefined;
  }
}

/** Keep `hello` for the next session with this peer (written only when it changed). */
export function rememberHello(stateDir: string, fingerprint: string, hello: Hello): void {
  const file = helloPath(stateDir, fingerprint);
  const text = JSON.stringify({ minVersion: hello.minVersion, maxVersion: hello.maxVersion, capabilities: hello.capabilities, role: hello.role, software: hello.software }) + '\n';
  try {
    if (fs.readFileSync(file, 'utf8') === text) return;
  } catch {
    // not remembered yet, or unreadable: written below
  }
  const tmp = `${file}.${process.pid}.tmp`;
  try {
    fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    fs.writeFileSync(tmp, text, { mode: 0o600 });
    fs.renameSync(tmp, file);
  } catch {
    fs.rmSync(tmp, { force: true });
  }
}

/** Forget the peer (`untrust`): a certificate no longer pinned is no longer known. */
export function forgetHello(stateDir: string, fingerprint: string): void {
  fs.rmSync(helloPath(stateDir, fingerprint), { force: true });
}
