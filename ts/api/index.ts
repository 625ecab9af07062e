// Public library API: the CLI is a thin layer over these.
export { send, type SendOptions } from './send.js';
export { receive, type ReceiveOptions } from './receive.js';
export { sync, type SyncOptions } from './sync.js';
export { pull, type PullOptions } from './pull.js';
export { id, trust, untrust, fingerprints, type StateOptions } from './identity.js';
export type { Pin } from '../security/pins.js';
export type { SyncEvents, SyncSummary, Phase } from './events.js';
export { FfsyncError, ExitCode } from '../utils/errors.js';
export { resolveStateDir } from '../utils/state-dir.js';
// Building blocks (scan / diff / reconstruct) for tools that bring their own transport.
export { scanFile, loadIndex, decodeManifest, openChunkSource, beginReconstruction, markUpToDate } from '../native/binding.js';
export type { ScanResult, PlanSummary, NativeReconstruction, NativeChunkSource, ScanOptions } from '../native/binding.js';
