'use strict';
// A passive declare of a missing queue: the broker closes the channel with 404.
// amqplib must reject the call and emit 'error' then 'close' on the channel,
// while the connection stays usable.
const { connect, run, uniqueName } = require('./common');

function once(emitter, event, ms) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no '${event}' event within ${ms} ms`)), ms);
    emitter.once(event, (value) => { clearTimeout(timer); resolve(value); });
  });
}

run(async (url) => {
  const connection = await connect(url);
  const channel = await connection.createChannel();
  const errorEvent = once(channel, 'error', 5000);
  const closeEvent = once(channel, 'close', 5000);
  const missing = uniqueName('amqplib-missing');

  let rejected = null;
  try {
    await channel.checkQueue(missing);
  } catch (err) {
    rejected = { code: err.code, message: err.message };
  }
  const error = await errorEvent;
  await closeEvent;

  // The connection survived: a new channel works.
  const fresh = await connection.createChannel();
  const { queue } = await fresh.assertQueue('', { exclusive: true });
  await fresh.close();
  await connection.close();
  return {
    missing,
    rejected,
    errorEvent: { code: error.code, message: error.message, classId: error.classId, methodId: error.methodId },
    connectionUsable: queue.startsWith('amq.gen-'),
  };
});
