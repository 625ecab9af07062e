// Errors normalized into one class with a stable `code` and the rsync-style exit code the
// CLI uses (table in docs/cli.md, "Exit codes"). Native errors arrive as "CODE: message".

export const ExitCode = {
  OK: 0,
  USAGE: 1,
  PROTOCOL_INCOMPATIBLE: 2,
  FILE_SELECTION: 3,
  /** rsync's "error starting client-server protocol" (its auth failures): unknown or mismatched peer. */
  UNTRUSTED: 5,
  SOCKET_IO: 10,
  FILE_IO: 11,
  PROTOCOL_STREAM: 12,
  SIGNAL: 20,
  PARTIAL: 23,
  VANISHED: 24,
  /** rsync's RERR_DEL_LIMIT: --max-delete left deletions undone. */
  DELETE_LIMIT: 25,
  TIMEOUT: 30,
  /** `sync` over ssh: the remote program is not on the remote PATH (the shell's 127). */
  REMOTE_COMMAND_MISSING: 127,
  /** `sync` over ssh: ssh itself failed (unreachable host, refused key), as rsync reports it. */
  SSH: 255,
} as const;
export type ExitCode = (typeof ExitCode)[keyof typeof ExitCode];

/** Where an error was raised: here, or on the peer (its ERROR frame, §4.10). A peer's error
 * is reported as its own ("peer: …") and never answered with an ERROR of ours. */
export type ErrorOrigin = 'local' | 'peer';

export class FfsyncError extends Error {
  readonly code: string;
  readonly exitCode: ExitCode;
  readonly origin: ErrorOrigin;
  /** Partial figures of the failed session (wire bytes, duration), when there was one. */
  summary?: unknown;
  constructor(code: string, exitCode: ExitCode, message: string, options?: { cause?: unknown; origin?: ErrorOrigin }) {
    super(message, options);
    this.name = 'FfsyncError';
    this.code = code;
    this.exitCode = exitCode;
    this.origin = options?.origin ?? 'local';
  }

  /** The same error with more words, keeping its code, exit code and origin. */
  withMessage(message: string): FfsyncError {
    return new FfsyncError(this.code, this.exitCode, message, { cause: this, origin: this.origin });
  }
}

/** Exit code for a native (core) error code, seen from the side that raised it. */
export const NATIVE_EXIT: Record<string, ExitCode> = {
  ENOENT: ExitCode.FILE_IO,
  EACCES: ExitCode.FILE_IO,
  EIO: ExitCode.FILE_IO,
  ENOSPC: ExitCode.FILE_IO,
  ENOTFILE: ExitCode.FILE_IO,
  // A source opened to be read is no longer the version that was scanned (the sender reports
  // it as the file vanishing: ts/api/content-send.ts).
  ECHANGED: ExitCode.VANISHED,
  EMALFORMED: ExitCode.PROTOCOL_STREAM,
  ECHUNK: ExitCode.PROTOCOL_STREAM,
  EVERIFY: ExitCode.PARTIAL,
  EUSAGE: ExitCode.USAGE,
  // QUIC transport (crates/ffsync_core/src/quic/)
  ETIMEDOUT: ExitCode.TIMEOUT,
  ECONNRESET: ExitCode.SOCKET_IO,
  ECLOSED: ExitCode.SOCKET_IO,
  ESOCKET: ExitCode.SOCKET_IO,
  EADDRINUSE: ExitCode.SOCKET_IO,
  EADDRNOTAVAIL: ExitCode.SOCKET_IO,
  ETLS: ExitCode.PROTOCOL_INCOMPATIBLE,
};

export function normalizeNativeError(e: unknown): FfsyncError {
  if (e instanceof FfsyncError) return e;
  const msg = e instanceof Error ? e.message : String(e);
  const m = /^([A-Z]+): ([\s\S]*)$/.exec(msg);
  if (m && m[1] in NATIVE_EXIT) return new FfsyncError(m[1], NATIVE_EXIT[m[1]], m[2], { cause: e });
  return new FfsyncError('EINTERNAL', ExitCode.FILE_IO, msg, { cause: e });
}

/** Map a Node system error (net/fs) to an FfsyncError. */
/** What a system error code means, in words, with what to do where there is something to do:
 * the context names the address or path, this says what went wrong there. */
const IN_WORDS: Record<string, string> = {
  ECONNREFUSED: 'connection refused (nothing listens there: is the receiver running, on this port?)',
  ECONNRESET: 'connection reset by the peer',
  EPIPE: 'connection closed by the peer while writing',
  ENOTFOUND: 'host not found (check the name, or use its IP address)',
  EAI_AGAIN: 'host name lookup failed for now (DNS did not answer; try again, or use the IP address)',
  EHOSTUNREACH: 'no route to the host (check the address and the network)',
  ENETUNREACH: 'network unreachable (check the address and the network)',
  ETIMEDOUT: 'timed out (is the host up, and is the port open in its firewall?)',
  EADDRINUSE: 'address already in use (another program listens on this port: pick another, or 0 for a free one)',
  EADDRNOTAVAIL: 'address not available on this machine (check --bind)',
  ENOENT: 'no such file or directory',
  ENOTDIR: 'a part of the path is not a directory',
  EISDIR: 'is a directory',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  ENOSPC: 'no space left on the device',
  EDQUOT: 'disk quota exceeded',
  EROFS: 'read-only file system',
  ELOOP: 'too many levels of symbolic links',
  ENAMETOOLONG: 'file name too long',
  EMFILE: 'too many open files (raise the limit: ulimit -n)',
  ENFILE: 'too many open files on this system',
  EXDEV: 'not on the same file system',
  EBUSY: 'resource busy',
  EIO: 'input/output error (the disk or file system reported a failure)',
};

/** A system error's words (IN_WORDS), or its own message for a code without any. */
export function systemErrorWords(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  return (err?.code && IN_WORDS[err.code]) || (err?.message ?? String(e));
}

export function fromSystemError(e: unknown, context: string): FfsyncError {
  if (e instanceof FfsyncError) return e;
  const err = e as NodeJS.ErrnoException;
  const code = err?.code ?? 'EIO';
  const socket = ['ECONNREFUSED', 'ECONNRESET', 'EADDRINUSE', 'EADDRNOTAVAIL', 'EPIPE', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT'];
  const exit = socket.includes(code) ? ExitCode.SOCKET_IO : ExitCode.FILE_IO;
  return new FfsyncError(code, exit, `${context}: ${systemErrorWords(e)}`, { cause: e });
}
