// Certificate fingerprints: SHA-256 of the DER certificate, shown as 16 groups of four
// upper-case hex digits ("3F2A-9C1B-…"). Parsing accepts any case and any separators.
import crypto from 'node:crypto';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { fingerprintHex } from './fingerprint-text.js';

export function fingerprintOfDer(der: Buffer): string {
  return formatFingerprint(crypto.createHash('sha256').update(der).digest('hex'));
}

export function fingerprintOfPem(pem: string): string {
  return fingerprintOfDer(new crypto.X509Certificate(pem).raw);
}

export function formatFingerprint(hex: string): string {
  return hex.toUpperCase().match(/.{4}/g)!.join('-');
}

/** Normalize user input to the canonical form; a usage error (exit 1) if it is not one. */
export function parseFingerprint(input: string): string {
  const hex = fingerprintHex(input);
  if (hex === undefined) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `not a SHA-256 fingerprint: '${input}' (expected 64 hex digits, as printed by 'ffsync-native id')`);
  }
  return formatFingerprint(hex);
}
