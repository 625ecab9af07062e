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
