// Per-path reader/writer locks for the daemon's sessions. Two paths conflict when one is
// the other or lies below it (a push of `builds` and a push of `builds/app/x` touch the
// same files). Writers exclude everyone on conflicting paths; readers (pulls) share.
// Waiters are served in arrival order among conflicting requests, so a stream of pulls
// cannot starve a push.

import { underPrefix } from './authorization.js';

export type LockMode = 'read' | 'write';

interface Holder {
  path: string;
  mode: LockMode;
  granted: boolean;
  grant: () => void;
}

export class PathLocks {
  private readonly queue: Holder[] = [];

  /** Resolves with a release function once no conflicting earlier request is pending or held.
   * `signal` withdraws a request not granted yet (its session is gone: it must not keep a
   * place in the queue, nor hold later requests behind it); the promise then rejects. */
  acquire(path: string, mode: LockMode, signal?: AbortSignal): Promise<() => void> {
    return new Promise((resolve, reject) => {
      const h: Holder = {
        path,
        mode,
        granted: false,
        grant: () => {
          let released = false;
          resolve(() => {
            if (released) return;
            released = true;
            this.queue.splice(this.queue.indexOf(h), 1);
            this.pump();
          });
        },
      };
      this.queue.push(h);
      signal?.addEventListener(
        'abort',
        () => {
          if (h.granted) return;
          this.queue.splice(this.queue.indexOf(h), 1);
          this.pump();
          reject(new Error('lock request withdrawn'));
        },
        { once: true },
      );
      this.pump();
    });
  }

  /** Sessions currently holding or waiting for a lock (for logs and tests). */
  get pending(): number {
    return this.queue.length;
  }

  private pump(): void {
    for (let i = 0; i < this.queue.length; i++) {
      const h = this.queue[i];
      if (h.granted) continue;
      const blocked = this.queue.slice(0, i).some((o) => conflicts(o, h));
      if (!blocked) {
        h.granted = true;
        h.grant();
      }
    }
  }
}

function conflicts(a: Holder, b: Holder): boolean {
  if (a.mode === 'read' && b.mode === 'read') return false;
  return underPrefix(a.path, b.path) || underPrefix(b.path, a.path);
}
