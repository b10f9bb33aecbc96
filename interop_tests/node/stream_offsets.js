'use strict';
// A stream (x-queue-type: stream) through amqplib: declare it, publish on a confirm channel, read it
// back from several offsets with a prefetch (acks return credit), follow its tail; then what a
// stream refuses: a consumer without a prefetch (406, its channel closes), and basic.get and a noAck
// consumer (540, the connection closes). amqplib encodes small integers as a byte ('b'), a
// timestamp only as {'!': 'timestamp', value: seconds}, and decodes the long offset header as a number.
const { connect, collector, run, uniqueName } = require('./common');

const COUNT = 10;

function once(emitter, event, ms) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no '${event}' event within ${ms} ms`)), ms);
    emitter.once(event, (value) => { clearTimeout(timer); resolve(value); });
  });
}

// Consume `count` deliveries from `offset` (undefined: no x-stream-offset) with `prefetch`, acking
// each; report body, offset header and its JS type, and redelivered.
async function read(connection, queue, offset, count, prefetch, whileConsuming) {
  const channel = await connection.createChannel();
  await channel.prefetch(prefetch);
  const received = collector(count, 10000, `deliveries from ${JSON.stringify(offset)}`);
  const args = offset === undefined ? {} : { 'x-stream-offset': offset };
  const { consumerTag } = await channel.consume(queue, (msg) => {
    const header = msg.properties.headers['x-stream-offset'];
    received.push({
      body: msg.content.toString(),
      offset: header,
      offsetType: typeof header,
      redelivered: msg.fields.redelivered,
    });
    channel.ack(msg);
  }, { arguments: args });
  if (whileConsuming) await whileConsuming();
  const items = (await received.done).slice(0, count);
  await channel.cancel(consumerTag);
  await channel.close();
  return items;
}

async function publish(connection, queue, bodies) {
  const channel = await connection.createConfirmChannel();
  const confirmed = [];
  for (const body of bodies) {
    channel.sendToQueue(queue, Buffer.from(body), {}, (err) => confirmed.push(err ? `nack:${body}` : body));
  }
  await channel.waitForConfirms();
  await channel.close();
  return confirmed;
}

// Run `operation(channel)` on a channel of a fresh connection; the broker must close the connection.
async function connectionRefusal(url, queue, operation) {
  const connection = await connect(url);
  const channel = await connection.createChannel();
  channel.on('error', () => {});
  const closed = once(connection, 'close', 5000);
  let rejected = null;
  try {
    await operation(channel);
  } catch (err) {
    rejected = { code: err.code, message: err.message };
  }
  const reason = await closed;
  return { rejected, closeCode: reason && reason.code, closeMessage: reason && reason.message };
}

run(async (url) => {
  const connection = await connect(url);
  const queue = uniqueName('amqplib-stream');
  const setup = await connection.createChannel();
  const declared = await setup.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'stream' } });
  const again = await setup.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'stream' } });

  const bodies = Array.from({ length: COUNT }, (_, i) => `m${i}`);
  // 'last' starts at the last chunk: the last body goes alone, after the others are confirmed, so
  // that chunk is that one message (RabbitMQ batches a burst of publishes into chunks).
  const confirmed = [
    ...await publish(connection, queue, bodies.slice(0, COUNT - 1)),
    ...await publish(connection, queue, bodies.slice(COUNT - 1)),
  ];

  const fromFirst = await read(connection, queue, 'first', COUNT, COUNT);
  const fromFour = await read(connection, queue, 4, COUNT - 4, 2);
  const fromLast = await read(connection, queue, 'last', 1, 5);
  const fromPast = await read(connection, queue, { '!': 'timestamp', value: 946684800 }, COUNT, COUNT); // 2000-01-01
  const fromInterval = await read(connection, queue, '1h', COUNT, COUNT);
  const fromTail = await read(connection, queue, undefined, 2, 5,
    () => publish(connection, queue, ['n0', 'n1']));

  // No prefetch: 406 on the consumer's channel; the connection stays.
  const bare = await connection.createChannel();
  const bareError = once(bare, 'error', 5000);
  let noPrefetch = null;
  try {
    await bare.consume(queue, () => {}, { arguments: { 'x-stream-offset': 'first' } });
  } catch (err) {
    noPrefetch = { code: err.code, message: err.message };
  }
  const noPrefetchEvent = await bareError;
  const stillOpen = await connection.createChannel();
  await stillOpen.checkQueue(queue);

  const get = await connectionRefusal(url, queue, (channel) => channel.get(queue));
  const noAck = await connectionRefusal(url, queue, async (channel) => {
    await channel.prefetch(10);
    await channel.consume(queue, () => {}, { noAck: true });
  });

  const deleted = await stillOpen.deleteQueue(queue);
  await connection.close();
  return {
    queue,
    declared,
    again,
    confirmed,
    fromFirst,
    fromFour,
    fromLast,
    fromPast,
    fromInterval,
    fromTail,
    noPrefetch,
    noPrefetchEvent: { code: noPrefetchEvent.code, message: noPrefetchEvent.message },
    get,
    noAck,
    deleted,
  };
});
