#!/usr/bin/env node
// The `ffsync-native` executable: it runs the program (./entry.ts, bundled as dist/cli/entry.js)
// with V8's compiled code of it kept between runs (./code-cache.ts, decisions §98). This file
// and code-cache.ts are bundled apart from the program (`npm run bundle:cli`), so that they
// load nothing of it.
import path from 'node:path';
import { startProgram } from './code-cache.js';
import { startEarlyWalks } from './early-walks.js';

// A local tree sync's walks run while the program loads (./early-walks.ts, decisions §101).
startEarlyWalks();
startProgram(path.join(__dirname, 'entry.js'));
