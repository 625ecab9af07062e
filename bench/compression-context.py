"""Issue 18, item 4: how much would compression context save on the release fixture's needed bytes?

Reads OUT_DIR/chunks.jsonl (bench/compression-context.ts) and compresses each file's needed chunks three ways:
  groups     as DATA does now: runs of needed chunks cut at GROUP bytes, each compressed on its own;
  matched    the same groups, each with a raw-content prefix of the last W bytes of *matched* chunks
             before it (data the receiver holds: rsync -z's idea, with zstd's longer window);
  stream     all of a file's needed bytes as one zstd stream (window 8 MiB): the context of the
             literal data sent before it.
Usage: python3 bench/compression-context.py OUT_DIR [LEVEL ...]   (needs `pip install zstandard`)
"""
import json, os, sys
import zstandard as zs

out = sys.argv[1]
levels = [int(x) for x in sys.argv[2:]] or [3, 9]
B = open(os.path.join(out, 'release-b')).read().strip()
GROUP = 1 << 20
W = 4 << 20

def groups(chunks):
    gs, cur = [], None
    for off, n, held in chunks:
        if held:
            cur = None
        elif cur and cur[1] + n <= GROUP and cur[0] + cur[1] == off:
            cur[1] += n
        else:
            cur = [off, n]
            gs.append(cur)
    return gs

def matched_prefix(data, chunks, off):
    parts, need = [], W
    for o, n, held in reversed(chunks):
        if not held or o + n > off:
            continue
        take = min(n, need)
        parts.append(data[o + n - take:o + n])
        need -= take
        if need <= 0:
            break
    return b''.join(reversed(parts))

for level in levels:
    plain = zs.ZstdCompressor(level=level)
    streaming = zs.ZstdCompressor(compression_params=zs.ZstdCompressionParameters.from_level(level, window_log=23))
    raw = grouped = matched = stream = 0
    for line in open(os.path.join(out, 'chunks.jsonl')):
        d = json.loads(line)
        data = open(os.path.join(B, d['path']), 'rb').read()
        literal = []
        for off, n in groups(d['chunks']):
            piece = data[off:off + n]
            literal.append(piece)
            raw += n
            g = len(plain.compress(piece))
            grouped += g
            pre = matched_prefix(data, d['chunks'], off)
            if pre:
                dct = zs.ZstdCompressionDict(pre, dict_type=zs.DICT_TYPE_RAWCONTENT)
                matched += len(zs.ZstdCompressor(level=level, dict_data=dct).compress(piece))
            else:
                matched += g
        if literal:
            stream += len(streaming.compress(b''.join(literal)))
    pct = lambda x: f'{100 * (x / grouped - 1):+.1f}%'
    print(f'level {level}: needed {raw:,} bytes; groups {grouped:,}; matched-data prefix {matched:,} ({pct(matched)}); '
          f'one stream per file {stream:,} ({pct(stream)})')
