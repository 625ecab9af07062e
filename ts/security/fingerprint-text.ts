// A fingerprint as a user writes it: 64 hex digits, any case, with or without `sha256:`, spaces,
// colons or dashes. Apart from ./fingerprint.ts (which loads node:crypto) so that the executable
// can check a `--trust` value before the program loads (ts/cli/early-connect.ts).

/** The 64 hex digits of a fingerprint written as above, or undefined if it is not one. */
export function fingerprintHex(input: string): string | undefined {
  const hex = input.replace(/^sha256:/i, '').replace(/[\s:-]/g, '');
  return /^[0-9a-fA-F]{64}$/.test(hex) ? hex : undefined;
}
