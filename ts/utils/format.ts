const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function formatBytes(n: number): string {
  let v = n;
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${n} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${UNITS[u]}`;
}

export function formatRate(bytes: number, ms: number): string {
  if (ms <= 0) return '';
  return `${formatBytes(Math.round((bytes / ms) * 1000))}/s`;
}

/**
 * A count as rsync prints it (its `human_num`): `level` 0 plain digits, 1 (rsync's default)
 * digits grouped by commas, 2 (`-h`) units of 1000 with two decimals (`100.27K`), 3 (`-hh`)
 * units of 1024.
 */
export function rsyncNumber(n: number, level: number): string {
  if (level >= 2) {
    const mult = level === 2 ? 1000 : 1024;
    if (Math.abs(n) >= mult) {
      let v = n / mult;
      let unit = 1;
      while (Math.abs(v) >= mult && unit < 6) {
        v /= mult;
        unit++;
      }
      return `${v.toFixed(2)}${' KMGTPE'[unit]}`;
    }
  }
  const digits = String(Math.trunc(n));
  return level >= 1 ? digits.replace(/\B(?=(\d{3})+(?!\d))/g, ',') : digits;
}

/** A rate or other fraction as rsync prints it (`human_dnum`): two decimals, the integer
 * part formatted as `rsyncNumber` does. */
export function rsyncDecimal(x: number, level: number): string {
  if (level >= 2 && Math.abs(x) >= (level === 2 ? 1000 : 1024)) return rsyncNumber(x, level);
  const [int, frac] = x.toFixed(2).split('.');
  return `${rsyncNumber(Number(int), level)}.${frac}`;
}
