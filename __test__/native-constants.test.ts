// Constants that exist on both sides of the N-API boundary are defined once, in the core, and
// the shell's copies are checked against it here: the manifest's header and entry sizes, a
// chunk record's header and the encodings that refer to the previous frame, the REFINE table's
// limit, TREE_OPTIONS' attribute bits, triage's small-file limit (the single-file scan ahead's
// threshold), and every error code the core can raise (each must map to an exit code in
// ts/utils/errors.ts, or the CLI would report it as an internal error).
import assert from 'node:assert/strict';
import { it } from 'node:test';
import { nativeConstants } from '../ts/native/binding';
import { MANIFEST_ENTRY, MANIFEST_HEADER } from '../ts/utils/manifest';
import { PREFIX_ENCODINGS, RECORD_HEADER } from '../ts/protocol/chunk-records';
import { NATIVE_EXIT, normalizeNativeError } from '../ts/utils/errors';
import { AttrFlag, MAX_REFINE_TABLE } from '../ts/protocol/messages';
import { SMALL_FILE_MAX } from '../ts/api/scan-ahead';

it('the shell’s wire constants are the core’s', () => {
  const c = nativeConstants();
  assert.equal(MANIFEST_HEADER, c.manifestHeader, 'manifest header');
  assert.equal(MANIFEST_ENTRY, c.manifestEntry, 'manifest entry');
  assert.equal(RECORD_HEADER, c.recordHeader, 'chunk record header');
  assert.deepEqual(PREFIX_ENCODINGS, c.prefixEncodings, 'record encodings that refer to the previous frame');
  assert.equal(MAX_REFINE_TABLE, c.refineTableMax, 'REFINE table limit');
  assert.deepEqual([AttrFlag.OWNER, AttrFlag.GROUP, AttrFlag.XATTRS, AttrFlag.NUMERIC_IDS], c.attrFlags, 'attribute bits');
  assert.equal(SMALL_FILE_MAX, c.smallFileMax, 'small-file limit');
});

it('every error code the core can raise has an exit code in the shell, and no stale one is left', () => {
  const codes = nativeConstants().errorCodes;
  assert.ok(codes.length >= 10, `${codes.length} codes`);
  for (const code of codes) {
    assert.ok(code in NATIVE_EXIT, `${code} has no exit code in ts/utils/errors.ts`);
    const e = normalizeNativeError(new Error(`${code}: something`));
    assert.equal(e.code, code);
    assert.equal(e.message, 'something');
  }
  for (const code of Object.keys(NATIVE_EXIT)) assert.ok(codes.includes(code), `${code} is mapped but the core never raises it`);
});
