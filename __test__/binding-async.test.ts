// Blocking work never runs on the JS thread: every native function that touches the file
// system, or whose work grows with a file or a tree, returns a Promise (its work runs on
// libuv's pool). The generated declarations (binding/index.d.ts) are read here, and every
// function or method that answers synchronously must be on the list below, with the reason
// it may: a new synchronous export fails this test until someone decides which kind it is.
// Found as a class: `NativeChunkSource.open`, `hasPartial` and `ensureDirBeneath` opened,
// read or created on the JS thread once per file (decisions §67), and `ensureDirBeneath`'s
// error was lost in a promise nobody awaited.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { it } from 'node:test';
import { ensureDirBeneath, hasPartial } from '../ts/native/binding';

const STATE = 'reads or sets fields of an object already in memory';
const SMALL = 'bounded CPU on its arguments (no file, no tree)';
const QUIC = 'hands a request to the QUIC runtime thread and returns';
const RELEASE = 'drops handles; closing happens on a background thread (drop_in_background)';

/** Synchronous native functions, by `Class.method` or function name, and why they may be. */
const ALLOWED_SYNC: Record<string, string> = {
  'NativeChunkSource.setLevel': STATE,
  'NativeChunkSource.batchCapacity': 'sums chunk lengths of the manifest in memory',
  'NativeChunkSource.unchanged': 'one fstat on the handle it holds open (no path lookup)',
  'NativeChunkSource.release': RELEASE,
  'NativePairing.message': SMALL,
  'NativePairing.finish': SMALL,
  'NativePairing.verify': SMALL,
  'NativePrefill.active': STATE,
  'NativePrefill.release': RELEASE,
  'NativeQuicConnection.peerCertificate': STATE,
  'NativeQuicConnection.wireBytes': STATE,
  'NativeQuicConnection.remoteAddress': STATE,
  'NativeQuicConnection.remotePort': STATE,
  'NativeQuicListener.port': STATE,
  'NativeQuicListener.address': STATE,
  'NativeQuicListener.stopAccepting': QUIC,
  'NativeQuicListener.close': QUIC,
  'NativeQuicStream.reset': QUIC,
  'NativeReconstruction.needed': STATE,
  'NativeReconstruction.summary': STATE,
  'NativeReconstruction.literalBytes': STATE,
  'NativeReconstruction.tempPath': STATE,
  'NativeReconstruction.abort': 'failure path only: marks the reconstruction abandoned (its temp file goes with the last handle)',
  'NativeReconstruction.release': RELEASE,
  'NativeScanStream.open': 'starts the scan on a thread of its own and returns',
  'NativeScanStream.setLevel': STATE,
  'NativeScanStream.release': RELEASE,
  'NativeTreeSync.setFsync': STATE,
  'NativeTreeSync.mergedRules': STATE,
  'NativeTreeSync.setBackup': SMALL,
  'NativeTreeSync.setChown': SMALL,
  'NativeTreeSync.setMaxDelete': STATE,
  'NativeTreeSync.setPartialDir': SMALL,
  'NativeTreeSync.entryCount': STATE,
  'NativeTreeSync.stats': STATE,
  'NativeTreeSync.releaseHandles': RELEASE,
  'NativeTreeSync.pushPeerManifestPart': 'appends one received frame (bounded by the frame size)',
  'NativeTreeSync.finishPeerManifest': 'decodes the peer manifest in memory, once per session',
  'NativeTreeSync.rootsToSupply': 'in-memory comparison of the two manifests, once per session',
  'NativeTreeSync.setPeerRoots': 'copies one received table into the tree, once per session',
  'NativeTreeSync.largeTransfers': STATE,
  'NativeTreeSync.scanAheadCandidates': "one pass over the walk's entries in memory, once per session",
  'NativeTreeSync.describe': STATE,
  'NativeTreeSync.itemize': 'formats the plan already made, once per session',
  'NativeTreeSync.clearFor': STATE,
  'NativeTreeSync.claimRoot': STATE,
  applyChmod: SMALL,
  scanFileBackground: 'hands the scan to the background pool and returns; its callback says how it went',
  decodeManifest: 'decodes one received manifest (bounded by the frames that carried it)',
  excludesFromText: SMALL,
  generateIdentity: 'one key pair for `id`, before any session',
  tcpRttMicros: 'one getsockopt(TCP_INFO) on a connected socket, once per session',
  nativeConstants: SMALL,
  normalizePairingCode: SMALL,
  pairingCode: SMALL,
  validateChown: SMALL,
  validateExcludes: SMALL,
  partialDirRule: SMALL,
};

interface Decl {
  name: string;
  returns: string;
}

/** Functions and methods of binding/index.d.ts with their declared return types. */
function declarations(): Decl[] {
  const text = fs.readFileSync(path.join(__dirname, '..', 'binding', 'index.d.ts'), 'utf8');
  const out: Decl[] = [];
  let cls: string | undefined;
  for (const line of text.split('\n')) {
    const c = /^export declare class (\w+)/.exec(line);
    if (c) {
      cls = c[1];
      continue;
    }
    if (line.startsWith('}')) cls = undefined;
    const f = /^export declare function (\w+)\(.*\):\s*(.+)$/.exec(line);
    if (f) out.push({ name: f[1], returns: f[2] });
    const m = cls && /^ {2}(?:static |get )?(\w+)\(.*\):\s*(.+)$/.exec(line);
    if (m && m[1] !== 'constructor') out.push({ name: `${cls}.${m[1]}`, returns: m[2] });
  }
  return out;
}

it('every synchronous native function is one that may block the JS thread only briefly, by a stated reason', () => {
  const decls = declarations();
  assert.ok(decls.length > 80, `${decls.length} declarations read: has the format of index.d.ts changed?`);
  const sync = decls.filter((d) => !d.returns.startsWith('Promise<'));
  const unlisted = sync.filter((d) => !(d.name in ALLOWED_SYNC)).map((d) => `${d.name}(): ${d.returns}`);
  assert.deepEqual(unlisted, [], 'synchronous native functions not on the list: make them return a Promise, or list them with the reason they may block');
  const names = new Set(sync.map((d) => d.name));
  const stale = Object.keys(ALLOWED_SYNC).filter((n) => !names.has(n));
  assert.deepEqual(stale, [], 'listed but no longer synchronous (or gone): remove them from the list');
});

it('the file-system calls that used to block answer through a Promise, and their failures reach the caller', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-binding-async-'));
  try {
    fs.mkdirSync(path.join(dir, 'real'));
    fs.symlinkSync(path.join(dir, 'real'), path.join(dir, 'link'));
    await ensureDirBeneath(dir, 'real/a/b', true);
    assert.ok(fs.statSync(path.join(dir, 'real/a/b')).isDirectory());
    // A link on the way is refused, and the refusal is the promise's (it used to be thrown
    // inside a promise nobody awaited: the caller saw success).
    await assert.rejects(ensureDirBeneath(dir, 'link/c', true), /not followed|link/i);
    assert.equal(fs.existsSync(path.join(dir, 'real/c')), false);
    assert.equal(await hasPartial(path.join(dir, 'real', 'f.bin')), false);
    fs.writeFileSync(path.join(dir, 'real', '.f.bin.0123456789abcdef.ffsync-part'), 'x');
    assert.equal(await hasPartial(path.join(dir, 'real', 'f.bin')), true);
    assert.equal(await hasPartial('f.bin', path.join(dir, 'real')), true);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
