// Who may do what under a `serve` root: <state>/serve-clients.conf, read at start and on
// SIGHUP. The format is line-based like ssh's authorized_keys (docs/cli.md "Serving many
// clients"):
//
//   # <fingerprint>  <access>  <prefix> [<prefix> ...]   [# note]
//   3F2A-9C1B-…      push       builds/app  releases/app  # build runner 1
//   77AB-…           pull       releases
//   5D10-…           push,pull  /
//   revoke 3F2A-9C1B-…                                     # runner retired
//
// Access is `push`, `pull` or both (comma-separated). A prefix is a path relative to the
// root, compared segment by segment (`builds/app` grants `builds/app` and everything
// below it, not `builds/app2`); `/` grants the whole root. `revoke <fingerprint>` refuses
// that client whatever other lines say (so an entry can be revoked without deleting it,
// and the log tells "revoked" from "unknown"). Any malformed line makes the whole file
// invalid: at start that is a start-up error, at reload the previous config stays.

import fs from 'node:fs';
import path from 'node:path';
import { parseFingerprint } from '../security/fingerprint.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { MAX_REQUEST_PATH } from '../protocol/messages.js';

export type Access = 'push' | 'pull';

export interface ClientEntry {
  fingerprint: string;
  access: Set<Access>;
  /** Normalized prefixes; '' is the whole root. */
  prefixes: string[];
  note: string;
  line: number;
}

export interface AuthorizationConfig {
  file: string;
  clients: Map<string, ClientEntry>;
  revoked: Map<string, { line: number; note: string }>;
}

export type Verdict = { ok: true; client: ClientEntry } | { ok: false; reason: string; code: 'EUNKNOWNCLIENT' | 'EREVOKED' | 'EFORBIDDEN' };

export function configPath(stateDir: string): string {
  return path.join(stateDir, 'serve-clients.conf');
}


/**
 * A request path relative to the serve root, normalized to `a/b/c` ('' = the root).
 * Absolute-looking paths are taken relative to the root; `.` and `..` segments, NUL and
 * backslashes are refused, so a path can never name anything outside the root.
 */
export function normalizeRequestPath(p: string): string {
  if (Buffer.byteLength(p, 'utf8') > MAX_REQUEST_PATH) throw new FfsyncError('EBADPATH', ExitCode.FILE_SELECTION, `path is longer than ${MAX_REQUEST_PATH} bytes`);
  if (p.includes('\0')) throw new FfsyncError('EBADPATH', ExitCode.FILE_SELECTION, 'path contains a NUL byte');
  if (p.includes('\\')) throw new FfsyncError('EBADPATH', ExitCode.FILE_SELECTION, `path '${p}' contains a backslash (use '/')`);
  const segs = p.split('/').filter((s) => s.length > 0);
  for (const s of segs) {
    if (s === '.' || s === '..') throw new FfsyncError('EBADPATH', ExitCode.FILE_SELECTION, `path '${p}' contains a '${s}' segment`);
  }
  return segs.join('/');
}

/** True when `p` is `prefix` or lies below it (segment-wise). */
export function underPrefix(p: string, prefix: string): boolean {
  return prefix === '' || p === prefix || p.startsWith(prefix + '/');
}

/** Parse a config file's text; throws one error naming file:line and the reason. */
export function parseConfig(text: string, file: string): AuthorizationConfig {
  const clients = new Map<string, ClientEntry>();
  const revoked = new Map<string, { line: number; note: string }>();
  const lines = text.split('\n');
  const bad = (n: number, why: string) => new FfsyncError('ECONFIG', ExitCode.USAGE, `${file}:${n}: ${why}`);
  for (let i = 0; i < lines.length; i++) {
    const n = i + 1;
    const hash = lines[i].indexOf('#');
    const note = hash >= 0 ? lines[i].slice(hash + 1).trim() : '';
    const body = (hash >= 0 ? lines[i].slice(0, hash) : lines[i]).trim();
    if (!body) continue;
    const words = body.split(/\s+/);
    const fpOf = (w: string | undefined) => {
      if (!w) throw bad(n, 'missing fingerprint');
      try {
        return parseFingerprint(w);
      } catch {
        throw bad(n, `'${w}' is not a fingerprint (64 hex digits, as printed by 'ffsync-native id')`);
      }
    };
    if (words[0] === 'revoke') {
      if (words.length !== 2) throw bad(n, "expected 'revoke <fingerprint>'");
      const fp = fpOf(words[1]);
      if (revoked.has(fp)) throw bad(n, `${fp} is already revoked on line ${revoked.get(fp)!.line}`);
      revoked.set(fp, { line: n, note });
      continue;
    }
    const fp = fpOf(words[0]);
    if (words.length < 3) throw bad(n, "expected '<fingerprint> <push|pull|push,pull> <prefix> [<prefix> ...]'");
    const access = new Set<Access>();
    for (const a of words[1].split(',')) {
      if (a !== 'push' && a !== 'pull') throw bad(n, `unknown access '${a}' (expected push, pull or push,pull)`);
      if (access.has(a)) throw bad(n, `access '${a}' given twice`);
      access.add(a);
    }
    const prefixes: string[] = [];
    for (const w of words.slice(2)) {
      try {
        prefixes.push(normalizeRequestPath(w));
      } catch (e) {
        throw bad(n, `prefix '${w}': ${(e as Error).message}`);
      }
    }
    const prev = clients.get(fp);
    if (prev) throw bad(n, `${fp} is already listed on line ${prev.line} (give one line per client, with all its prefixes)`);
    clients.set(fp, { fingerprint: fp, access, prefixes, note, line: n });
  }
  return { file, clients, revoked };
}

/** Read and parse the config; a missing or unreadable file is a start-up error. */
export function loadConfig(file: string): AuthorizationConfig {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') {
      throw new FfsyncError(
        'ECONFIG',
        ExitCode.USAGE,
        `no authorization config at ${file}: create it with one line per client, '<fingerprint> <push|pull|push,pull> <prefix> ...' (see docs/cli.md, "Serving many clients")`,
      );
    }
    throw new FfsyncError('ECONFIG', ExitCode.USAGE, `cannot read authorization config ${file}: ${(e as Error).message}`);
  }
  return parseConfig(text, file);
}

/** May this client do `access` on `requestPath` (already normalized)? */
export function authorize(config: AuthorizationConfig, fingerprint: string, access: Access, requestPath: string): Verdict {
  if (config.revoked.has(fingerprint)) return { ok: false, code: 'EREVOKED', reason: `client ${fingerprint} has been revoked` };
  const client = config.clients.get(fingerprint);
  if (!client) return { ok: false, code: 'EUNKNOWNCLIENT', reason: `client ${fingerprint} is not authorized on this server` };
  if (!client.access.has(access)) return { ok: false, code: 'EFORBIDDEN', reason: `client ${fingerprint} may not ${access} (it may ${[...client.access].join(' and ')})` };
  if (!client.prefixes.some((p) => underPrefix(requestPath, p))) {
    const shown = client.prefixes.map((p) => (p === '' ? '/' : p)).join(', ');
    return { ok: false, code: 'EFORBIDDEN', reason: `'${requestPath || '/'}' is outside the prefixes granted to client ${fingerprint} (${shown})` };
  }
  return { ok: true, client };
}
