'use strict';
// Topic exchange with * and # bindings; each queue reports the keys it received.
const { connect, run, uniqueName } = require('./common');

const KEYS = ['quick.orange.rabbit', 'lazy.orange.elephant', 'quick.orange.fox', 'lazy.brown.fox',
  'lazy.pink.rabbit', 'quick.brown.fox', 'orange', 'quick.orange.male.rabbit', 'lazy', 'lazy.orange.male.rabbit'];

async function drain(channel, queue) {
  const keys = [];
  for (;;) {
    const msg = await channel.get(queue, { noAck: true });
    if (msg === false) return keys;
    keys.push(msg.fields.routingKey);
  }
}

run(async (url) => {
  const connection = await connect(url);
  const channel = await connection.createConfirmChannel();
  const exchange = uniqueName('amqplib-topic');
  await channel.assertExchange(exchange, 'topic', { durable: false, autoDelete: true });
  const q1 = (await channel.assertQueue('', { exclusive: true })).queue;
  const q2 = (await channel.assertQueue('', { exclusive: true })).queue;
  await channel.bindQueue(q1, exchange, '*.orange.*');
  await channel.bindQueue(q2, exchange, '*.*.rabbit');
  await channel.bindQueue(q2, exchange, 'lazy.#');
  for (const key of KEYS) {
    channel.publish(exchange, key, Buffer.from(key));
  }
  await channel.waitForConfirms();
  const result = { orange: await drain(channel, q1), rabbitOrLazy: await drain(channel, q2) };
  await channel.close();
  await connection.close();
  return result;
});
