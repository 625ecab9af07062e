#!/usr/bin/env node
// The `ffsync-native` executable: it runs the program (./entry.ts, bundled as dist/cli/entry.js)
// with V8's compiled code of it kept between runs (./code-cache.ts, decisions §98). This file
// and code-cache.ts are bundled apart from the program (`npm run bundle:cli`), so that they
// load nothing of it.
import path from 'node:path';
import { startProgram } from './code-cache.js';
import { startEarlyConnect } from './early-connect.js';
import { startEarlyWalks } from './early-walks.js';

// A local tree sync's walks run while the program loads (./early-walks.ts, decisions §101).
startEarlyWalks();
// A plain `send`'s TCP handshake crosses while the program loads (./early-connect.ts, decisions §110):
// Node sends the SYN on the next tick, so the program loads after it.
const program = path.join(__dirname, 'entry.js');
if (startEarlyConnect()) process.nextTick(() => startProgram(program));
else startProgram(program);
