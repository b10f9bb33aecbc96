'use strict';
// assertQueue with amqplib's argument options (they become x-arguments); check the
// declare-ok, a re-assert with the same options, and that the arguments act:
// x-max-length 2 with a dead-letter exchange sends the overflow there.
const { connect, run, uniqueName } = require('./common');

run(async (url) => {
  const connection = await connect(url);
  const channel = await connection.createConfirmChannel();
  const dlx = uniqueName('amqplib-dlx');
  const name = uniqueName('amqplib-args');
  await channel.assertExchange(dlx, 'fanout', { durable: false, autoDelete: true });
  const deadLetters = (await channel.assertQueue('', { exclusive: true })).queue;
  await channel.bindQueue(deadLetters, dlx, '');

  const options = {
    durable: false,
    exclusive: true,
    messageTtl: 60000,
    expires: 120000,
    maxLength: 2,
    maxPriority: 3,
    deadLetterExchange: dlx,
    deadLetterRoutingKey: 'dead',
    arguments: { 'x-queue-mode': 'default', 'x-custom-flag': true },
  };
  const declared = await channel.assertQueue(name, options);
  const again = await channel.assertQueue(name, options);

  for (let i = 0; i < 4; i++) channel.sendToQueue(name, Buffer.from(String(i)), { priority: 1 });
  await channel.waitForConfirms();
  const kept = [];
  const dead = [];
  for (let msg; (msg = await channel.get(name, { noAck: true })) !== false;) kept.push(msg.content.toString());
  for (let msg; (msg = await channel.get(deadLetters, { noAck: true })) !== false;) {
    dead.push({ body: msg.content.toString(), routingKey: msg.fields.routingKey, reason: msg.properties.headers['x-death'][0].reason });
  }
  await channel.close();
  await connection.close();
  return { declared, again, kept, dead };
});
