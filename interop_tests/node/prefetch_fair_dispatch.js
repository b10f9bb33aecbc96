'use strict';
// Two consumers with prefetch 1 on separate channels. "slow" holds its first
// delivery unacked, so the broker must send every other message to "fast".
const { connect, collector, run, uniqueName } = require('./common');

const COUNT = 20;

run(async (url) => {
  const connection = await connect(url);
  const setup = await connection.createConfirmChannel();
  const queue = uniqueName('amqplib-fair');
  await setup.assertQueue(queue, { durable: false, exclusive: true });

  const slow = await connection.createChannel();
  const fast = await connection.createChannel();
  await slow.prefetch(1);
  await fast.prefetch(1);

  const all = collector(COUNT, 10000, 'deliveries');
  const held = [];
  await slow.consume(queue, (msg) => {
    held.push(msg);
    all.push({ who: 'slow', body: msg.content.toString() });
  });
  await fast.consume(queue, (msg) => {
    all.push({ who: 'fast', body: msg.content.toString() });
    fast.ack(msg);
  });

  for (let i = 0; i < COUNT; i++) setup.sendToQueue(queue, Buffer.from(String(i)));
  await setup.waitForConfirms();
  const deliveries = await all.done;
  // Nothing more may arrive: slow still holds one, everything else was acked by fast.
  const check = await setup.checkQueue(queue);
  for (const msg of held) slow.ack(msg);
  await slow.close();
  await fast.close();
  await setup.close();
  await connection.close();
  return {
    slow: deliveries.filter((d) => d.who === 'slow').map((d) => d.body),
    fast: deliveries.filter((d) => d.who === 'fast').map((d) => d.body),
    readyAfter: check.messageCount,
  };
});
