'use strict';
// Shared by every scenario: connect the way older amqplib did, print one JSON
// result line, and never hang (a hard deadline ends the process).
const amqp = require('amqplib');

const DEADLINE_MS = 20000;

// amqplib < 0.10.7 proposed frame_max 4096 in tune-ok; pin it so the broker must
// split bodies into 4 KiB frames and accept that small a frame size.
const FRAME_MAX = 4096;

function withFrameMax(url) {
  return url + (url.includes('?') ? '&' : '?') + 'frameMax=' + FRAME_MAX;
}

async function connect(url) {
  const connection = await amqp.connect(withFrameMax(url));
  // A connection-level error would otherwise be an unhandled 'error' event.
  connection.on('error', () => {});
  return connection;
}

// Resolve with the first `count` values pushed through `push`, or reject after `ms`.
function collector(count, ms, what) {
  const items = [];
  let resolve;
  let reject;
  const done = new Promise((res, rej) => { resolve = res; reject = rej; });
  const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}: got ${items.length}/${count}`)), ms);
  function push(item) {
    items.push(item);
    if (items.length === count) {
      clearTimeout(timer);
      resolve(items);
    }
  }
  if (count === 0) { clearTimeout(timer); resolve(items); }
  return { push, done, items };
}

// Run `scenario(url)` and print its result as JSON on the last stdout line.
function run(scenario) {
  const url = process.argv[2];
  if (!url) {
    console.log(JSON.stringify({ ok: false, error: 'usage: node script.js AMQP_URL' }));
    process.exit(2);
  }
  const deadline = setTimeout(() => {
    console.log(JSON.stringify({ ok: false, error: `scenario exceeded ${DEADLINE_MS} ms` }));
    process.exit(3);
  }, DEADLINE_MS);
  deadline.unref();
  scenario(url).then(
    (result) => {
      console.log(JSON.stringify({ ok: true, ...result }));
      process.exit(0);
    },
    (err) => {
      console.log(JSON.stringify({ ok: false, error: String(err && err.stack || err), code: err && err.code }));
      process.exit(1);
    },
  );
}

function uniqueName(prefix) {
  return `${prefix}-${process.pid}-${Math.random().toString(16).slice(2, 10)}`;
}

module.exports = { connect, collector, run, uniqueName, FRAME_MAX };
