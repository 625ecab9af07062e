// DATA turns of a multiplexed tree session (ts/utils/data-turns.ts): at most N holders, turns
// given in plan order whatever order the files ask in, a file that needs no data passes.
import assert from 'node:assert/strict';
import { it } from 'node:test';
import { ConnectionShare, DataTurns, LANE_AHEAD_BYTES, LANE_AHEAD_FILES, SharedUnits } from '../ts/utils/data-turns';
import { SEND_BUFFERS } from '../ts/api/content-send';
import { DATA_BUFFERS, dataBuffers } from '../ts/api/tree-send';

const tick = () => new Promise((r) => setImmediate(r));

it('turns go in plan order, two units at a time, whatever order the files ask in; passed turns are skipped', async () => {
  const turns = new DataTurns(2);
  const t = [0, 1, 2, 3, 4].map((i) => turns.turn(i));
  const granted: number[] = [];
  const ask = (i: number) => t[i].take(1).then(() => granted.push(i));
  // Files 3 and 1 ask first: 1 is not file 0, so nothing is granted yet except in order.
  void ask(3);
  void ask(1);
  await tick();
  assert.deepEqual(granted, [], 'file 0 has not asked or passed: nobody goes before it');
  t[0].done(); // file 0 needs no data: passes its turn
  await tick();
  assert.deepEqual(granted, [1], 'file 1 goes next; file 3 waits for file 2');
  void ask(2);
  await tick();
  assert.deepEqual(granted, [1, 2], 'two holders at once');
  void ask(4);
  await tick();
  assert.deepEqual(granted, [1, 2], 'no third holder: 3 and 4 wait');
  t[1].done();
  await tick();
  assert.deepEqual(granted, [1, 2, 3]);
  t[2].done();
  await tick();
  assert.deepEqual(granted, [1, 2, 3, 4]);
  t[3].done();
  t[4].done();
  t[4].done(); // idempotent
  await t[4].take(); // after done: no wait
});

it('a turn given back between its grant and the taker resuming returns its units (not passed twice)', async () => {
  const turns = new DataTurns(1);
  const a = turns.turn(0);
  const b = turns.turn(1);
  const taking = a.take(1); // granted at once: its promise resolves on a later tick
  a.done(); // before the taker resumed
  let bGranted = false;
  void b.take(1).then(() => (bGranted = true));
  await taking;
  await tick();
  assert.equal(bGranted, true, "a's unit came back: b goes");
  b.done();
  // The budget is whole again: a third file gets it at once.
  let cGranted = false;
  void turns.turn(2).take(1).then(() => (cGranted = true));
  await tick();
  assert.equal(cGranted, true);
});

it('a turn given back before it was asked for lets later files go (a file that failed early)', async () => {
  const turns = new DataTurns(1);
  const a = turns.turn(0);
  const b = turns.turn(1);
  let bGranted = false;
  void b.take(1).then(() => (bGranted = true));
  await tick();
  assert.equal(bGranted, false);
  a.done();
  await tick();
  assert.equal(bGranted, true);
});

it('a turn holds the units it asked for: a big file waits until enough are free, later small ones wait behind it', async () => {
  const turns = new DataTurns(4);
  const [small, big, after] = [0, 1, 2].map((i) => turns.turn(i));
  const granted: string[] = [];
  void small.take(1).then(() => granted.push('small'));
  void big.take(4).then(() => granted.push('big'));
  void after.take(1).then(() => granted.push('after'));
  await tick();
  assert.deepEqual(granted, ['small'], 'big needs all 4 units; after waits behind big (plan order)');
  small.done();
  await tick();
  assert.deepEqual(granted, ['small', 'big']);
  big.done();
  await tick();
  assert.deepEqual(granted, ['small', 'big', 'after']);
  // Asking for more than the budget takes all of it: it waits while `after` holds one unit,
  // and goes once that unit is back (it would wait forever if it asked for 99 of 4).
  const overAsking = turns.turn(3).take(99).then(() => 'granted');
  assert.equal(await Promise.race([overAsking, tick().then(() => 'waiting')]), 'waiting');
  after.done();
  assert.equal(await Promise.race([overAsking, tick().then(() => 'still waiting')]), 'granted');
});

it("a session's budget: one big file's read-ahead at a time on one connection, two with lanes (decisions §78)", async () => {
  for (const [connections, atOnce] of [
    [1, 1],
    [4, 2],
  ] as const) {
    const turns = new DataTurns(dataBuffers(connections));
    const t = [0, 1, 2].map((i) => turns.turn(i));
    const granted: number[] = [];
    for (const i of [0, 1, 2]) void t[i]!.take(SEND_BUFFERS).then(() => granted.push(i));
    await tick();
    assert.deepEqual(granted, [0, 1].slice(0, atOnce), `${connections} connection(s): big files sending at once`);
    t[0]!.done();
    await tick();
    assert.deepEqual(granted, [0, 1, 2].slice(0, atOnce + 1), `${connections} connection(s): the next file goes when one is done`);
  }
  // Small deltas (one buffer each) still go several at once on one connection.
  const turns = new DataTurns(dataBuffers(1));
  const small = [0, 1, 2, 3, 4].map((i) => turns.turn(i));
  let going = 0;
  for (const s of small) void s.take(1).then(() => going++);
  await tick();
  assert.equal(going, 4, 'four small deltas at once');
});

it('with lanes, a connection takes files only a little ahead of its DATA (decisions §81)', async () => {
  const MiB = 1024 * 1024;
  const share = new ConnectionShare(DATA_BUFFERS, new SharedUnits(dataBuffers(4)));
  assert.equal(LANE_AHEAD_FILES, 2);
  assert.equal(LANE_AHEAD_BYTES, 16 * MiB);
  // Two big files: the connection is full (before §81 its streams took every file at once).
  const a = share.turn(64 * MiB);
  assert.ok(share.hasRoom(), 'one file: room for the next, whose round trips cross its DATA');
  const b = share.turn(64 * MiB);
  assert.equal(share.hasRoom(), false, 'two big files ahead: the next file waits for another connection');
  let changed = false;
  void share.changed().then(() => (changed = true));
  // Small files fill it up to the bytes bound: 1 MiB files, sixteen of them.
  const small = new ConnectionShare(DATA_BUFFERS, new SharedUnits(dataBuffers(4)));
  const t = Array.from({ length: 16 }, () => small.turn(MiB));
  assert.equal(small.hasRoom(), false, '16 MiB of files ahead');
  // Their needs come back small (4 KiB deltas): room again, so deltas keep the window full.
  await t[0]!.take(1, 4096);
  assert.ok(small.hasRoom(), `expected ${small.load.bytes} bytes after one need`);
  // A file that needs nothing leaves the share at once.
  t[1]!.done();
  assert.equal(small.load.files, 15);
  for (const x of t) x.done();
  assert.deepEqual(small.load, { files: 0, bytes: 0 });
  // A file whose DATA is out frees its place, and wakes the streams waiting for one.
  await a.take(DATA_BUFFERS);
  a.done();
  await tick();
  assert.ok(changed, 'waiting streams are told');
  assert.ok(share.hasRoom());
  b.done();
  // The first connection while its lanes join: one file at a time, however small.
  const first = new ConnectionShare(DATA_BUFFERS, new SharedUnits(dataBuffers(2)));
  first.holdOne(true);
  const f0 = first.turn(MiB);
  assert.equal(first.hasRoom(), false, 'a second file waits for a lane');
  let woke = false;
  void first.changed().then(() => (woke = true));
  first.holdOne(false);
  await tick();
  assert.ok(woke && first.hasRoom(), 'once the lanes joined, the usual room');
  f0.done();
  // Without lanes (one connection, QUIC, in-process): always room.
  const one = new ConnectionShare(DATA_BUFFERS);
  for (let i = 0; i < 10; i++) one.turn(64 * MiB);
  assert.ok(one.hasRoom());
});

it("lanes: each connection sends one big file at a time, two at once in the session, from the session's units", async () => {
  const units = new SharedUnits(dataBuffers(3));
  const conns = [0, 1, 2].map(() => new ConnectionShare(DATA_BUFFERS, units));
  const granted: string[] = [];
  // Two big files on each connection, asked for together.
  const t = conns.map((c, ci) => [0, 1].map((fi) => ({ name: `c${ci}f${fi}`, turn: c.turn(64 * 1024 * 1024) })));
  for (const row of t) for (const f of row) void f.turn.take(SEND_BUFFERS).then(() => granted.push(f.name));
  await tick();
  assert.deepEqual(granted, ['c0f0', 'c1f0'], 'two big files at once, on two connections (each connection in its own order)');
  t[0]![0]!.turn.done();
  await tick();
  assert.deepEqual(granted, ['c0f0', 'c1f0', 'c2f0'], 'the waiting connection goes next, first come first served');
  assert.equal(units.available, 0);
  // One done() each: units held by files that were granted go back; a file granted its
  // connection's turn but still waiting for the session's units gives both back; the ones
  // not granted anything pass their turns.
  for (const row of t) for (const f of row) f.turn.done();
  await tick();
  assert.equal(units.available, dataBuffers(3), 'every unit back');
  // Small deltas: up to four at once per connection, eight in the session.
  const small = conns.flatMap((c) => Array.from({ length: 4 }, () => c.turn(1024 * 1024)));
  let going = 0;
  for (const s of small) void s.take(1, 4096).then(() => going++);
  await tick();
  assert.equal(going, 8);
  for (const s of small) s.done();
  await tick();
  assert.equal(units.available, dataBuffers(3));
});
