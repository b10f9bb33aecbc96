'use strict';
// Confirm channel: publish with per-message callbacks and waitForConfirms, then
// consume and ack everything; report what the broker negotiated and delivered.
const { connect, collector, run } = require('./common');

const COUNT = 50;

run(async (url) => {
  const connection = await connect(url);
  const channel = await connection.createConfirmChannel();
  const { queue } = await channel.assertQueue('', { exclusive: true });

  const confirmed = [];
  for (let i = 0; i < COUNT; i++) {
    // Every 10th body is larger than one 4 KiB frame.
    const body = i % 10 === 0 ? Buffer.alloc(10000, i) : Buffer.from(`message ${i}`);
    channel.sendToQueue(queue, body, { messageId: `m${i}`, contentType: 'text/plain' }, (err) => {
      confirmed.push(err ? `nack:${i}` : i);
    });
  }
  await channel.waitForConfirms();

  const received = collector(COUNT, 10000, 'deliveries');
  const { consumerTag } = await channel.consume(queue, (msg) => {
    received.push({
      id: msg.properties.messageId,
      size: msg.content.length,
      redelivered: msg.fields.redelivered,
      contentType: msg.properties.contentType,
    });
    channel.ack(msg);
  });
  const deliveries = await received.done;
  await channel.cancel(consumerTag);
  const check = await channel.checkQueue(queue);
  await channel.close();
  await connection.close();
  return {
    frameMax: connection.connection.frameMax,
    serverCapabilities: connection.connection.serverProperties.capabilities,
    queueName: queue,
    confirmed,
    deliveries,
    remaining: check.messageCount,
  };
});
