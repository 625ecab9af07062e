import { walkTree, call } from './ts/native/binding.ts';
import { manifestFrames } from './ts/protocol/messages.ts';
const [src, dst, st] = process.argv.slice(2);
const ms = (t: number) => (performance.now() - t).toFixed(1);
(async () => {
  for (let i = 0; i < 3; i++) {
    const s = await walkTree(src!, { excludes: [], stateDir: st, isSender: true } as any);
    const r = await walkTree(dst!, { excludes: [], stateDir: st, isSender: false } as any);
    let t = performance.now(); const ms1 = s.manifest(); const a = ms(t);
    t = performance.now(); const ms2 = r.manifest(); const b = ms(t);
    t = performance.now(); for (const p of manifestFrames(ms1)) r.pushPeerManifestPart(p.subarray(4)); const c = ms(t);
    t = performance.now(); r.finishPeerManifest(); const d = ms(t);
    for (const p of manifestFrames(ms2)) s.pushPeerManifestPart(p.subarray(4)); s.finishPeerManifest();
    t = performance.now(); const mine = s.rootsToSupply(false); const e = ms(t);
    const rs = await s.hashEntries(mine, undefined); const rr = await r.hashEntries(r.rootsToSupply(false), undefined);
    t = performance.now(); s.setPeerRoots(rr); r.setPeerRoots(rs); const f = ms(t);
    t = performance.now(); const cnt = s.triage(false, false); const g = ms(t);
    console.log(`manifest send ${a} recv ${b} (${ms1.length} B) push ${c} finish ${d} rootsToSupply ${e} setPeerRoots x2 ${f} triage ${g}`, cnt.unchangedFiles);
  }
})();
