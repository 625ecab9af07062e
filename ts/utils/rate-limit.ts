// --bwlimit: one limiter per session, however many files send at once.

/** Sleeps as needed so the average rate since the first call stays under `bytesPerSec`. */
export function rateLimiter(bytesPerSec: number): (n: number) => Promise<void> {
  const t0 = Date.now();
  let sent = 0;
  return async (n) => {
    sent += n;
    const ahead = (sent / bytesPerSec) * 1000 - (Date.now() - t0);
    if (ahead > 0) await new Promise((r) => setTimeout(r, ahead));
  };
}
