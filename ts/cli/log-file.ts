// rsync's --log-file=FILE for `sync`: each line stamped `YYYY/MM/DD HH:MM:SS [pid] ` in local
// time, appended: "building file list", the itemized changes (`%i %n%L`, rsync's default
// --log-file-format, trees), then the totals as rsync writes them (or the error).
import fs from 'node:fs';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { rsyncNumber } from '../utils/format.js';
import type { SyncSummary } from '../api/events.js';

export interface LogFile {
  line(text: string): void;
  /** The closing line(s): with -v the two rsync prints on stdout, else one. */
  end(s: SyncSummary | undefined, verbose: boolean, error?: string): void;
}

function stamp(d = new Date()): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}/${p(d.getMonth() + 1)}/${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())} [${process.pid}] `;
}

export function openLogFile(file: string): LogFile {
  let fd: number;
  try {
    fd = fs.openSync(file, 'a', 0o644);
  } catch (e) {
    throw new FfsyncError('ELOGFILE', ExitCode.FILE_IO, `--log-file: cannot open ${file}: ${(e as Error).message}`);
  }
  // Synchronous appends: a log must hold what happened even if the process dies next.
  const write = (text: string) => fs.writeSync(fd, `${stamp()}${text}\n`);
  write('building file list');
  return {
    line: write,
    end(s, verbose, error) {
      if (error) write(`ffsync-native error: ${error}`);
      if (s) {
        const { sent, received } = s.bytesOnWire;
        const n = (x: number) => rsyncNumber(x, 1);
        if (verbose) {
          const seconds = Math.max(s.durationMs, 1) / 1000;
          write(`sent ${n(sent)} bytes  received ${n(received)} bytes  ${((sent + received) / seconds).toFixed(2)} bytes/sec`);
          write(`total size is ${n(s.size)}  speedup is ${(sent + received > 0 ? s.size / (sent + received) : 0).toFixed(2)}`);
        } else write(`sent ${n(sent)} bytes  received ${n(received)} bytes  total size ${n(s.size)}`);
      }
      fs.closeSync(fd);
    },
  };
}
